"""The run cache's keys stay valid as the configuration grows: every run stored in the
repository still hashes to its file name from the configuration it recorded, a knob added since
cache version 1 changes the key only when set away from its default, and result-neutral
settings (the data directory; the compute device is no configuration field at all) never do."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.config import FedCureConfig, apply_flat, build_config
from fedcure_app.experiments.budget import get_budget
from fedcure_app.experiments.runner import V1_FIELDS, RunSpec, key_config

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

#: Each cache folder in the repository and the budget that filled it.
CACHES = {
    RESULTS / "paper" / "mnist" / "runs": ("paper", "mnist"),
    RESULTS / "mnist" / "runs": ("quick", "mnist"),
    RESULTS / "digits" / "runs": ("quick", "digits"),
}


def stored_runs() -> list[tuple[Path, int | None]]:
    """(file, eval samples of its budget) of every cached run in the repository."""
    out = []
    for folder, (budget, dataset) in CACHES.items():
        samples = get_budget(budget, dataset).eval_samples
        out += [(p, samples) for p in sorted(folder.glob("*.json.gz"))]
    return out


def test_the_repository_holds_the_caches_this_test_checks():
    runs = stored_runs()
    assert len([p for p, _ in runs if "paper" in p.parts]) >= 38
    assert {p.parent for p, _ in runs} == set(CACHES)


@pytest.mark.parametrize("path,samples", stored_runs(), ids=lambda v: getattr(v, "name", None))
def test_every_stored_run_still_hashes_to_its_file_name(path, samples):
    result = json.loads(gzip.open(path, "rt").read())
    cfg = build_config(result["config"])  # today's schema: newer knobs at their defaults
    schedule_only = bool(result.get("schedule_only"))
    spec = RunSpec(result["label"], cfg, None if schedule_only else samples, schedule_only)
    assert f"{spec.key}.json.gz" == path.name, result["label"]


def test_a_field_newer_than_cache_version_1_enters_the_key_only_when_set():
    base = FedCureConfig()
    newer = {(s, n) for s, fields in base.model_dump().items() for n in (fields or {})
             if n not in V1_FIELDS.get(s, frozenset())}
    assert {("method", "momentum"), ("method", "tau_c_unit")} <= newer
    for section, name in newer:
        assert name not in key_config(base).get(section, {})
    spec = RunSpec("a", base)
    for flat in ({"momentum": 0.9}, {"tau-c-unit": "epochs"}):
        changed = RunSpec("a", apply_flat(base, flat))
        assert changed.key != spec.key, flat
    # back at the default: the same key again
    assert RunSpec("a", apply_flat(base, {"momentum": 0.0})).key == spec.key
    # an optional section (a user's task) enters the key only when set
    assert "task" not in key_config(base)
    from fedcure_app.config import build_config

    data = base.model_dump()
    data["task"] = {"classes": [str(i) for i in range(10)], "input-shape": [1, 8, 8]}
    with_task = RunSpec("a", build_config(data))
    assert with_task.key != spec.key and "task" in key_config(with_task.cfg)


@settings(max_examples=40, deadline=None)
@given(momentum=st.floats(0.0, 0.99, allow_nan=False),
       unit=st.sampled_from(["steps", "epochs"]), data_dir=st.text(max_size=20))
def test_key_depends_on_the_knobs_but_not_on_the_data_dir(momentum, unit, data_dir):
    base = FedCureConfig()
    cfg = apply_flat(base, {"momentum": momentum, "tau-c-unit": unit, "data-dir": data_dir})
    same = (momentum == 0.0) and unit == "steps"
    assert (RunSpec("a", cfg).key == RunSpec("a", base).key) == same


def test_v1_fields_are_all_still_in_the_schema():
    dump = FedCureConfig().model_dump()
    for section, names in V1_FIELDS.items():
        assert names <= set(dump[section]), section
