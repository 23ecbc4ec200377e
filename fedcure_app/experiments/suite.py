"""Run experiments over datasets: load each dataset (or skip it with a reason), run the planned
simulations once through a shared :class:`~fedcure_app.experiments.runner.Runner`, analyse.

Output layout under ``out``: ``<dataset>/<experiment>/`` (PNG figures and ``summary.json``) and
``<dataset>/runs/`` (the cached run results, gzipped JSON, keyed by configuration hash).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from fedcure_app.data import DATASETS, DatasetError, load_dataset
from fedcure_app.experiments import NAMES, ablation, clustering, efficiency, formation, rh, table1
from fedcure_app.experiments.base import Context, Section
from fedcure_app.experiments.budget import Budget, get_budget
from fedcure_app.experiments.jobs import run_parallel
from fedcure_app.experiments.readings import LITERAL, READINGS, get_reading
from fedcure_app.experiments.runner import Runner

log = logging.getLogger(__name__)

#: Experiment name -> module, in the order they run (Table 1 first: the clustering, RH and
#: ablation experiments reuse its FedCure runs). ``all`` runs the paper's (:data:`NAMES`).
EXPERIMENTS: dict[str, ModuleType] = {
    "table1": table1, "clustering": clustering, "rh": rh, "efficiency": efficiency,
    "formation": formation, "ablation": ablation,
}
#: The order sections appear in the report (the paper's, then ours).
REPORT_ORDER: tuple[str, ...] = ("formation", "clustering", "table1", "efficiency", "rh",
                                 "ablation")
#: The experiments a reading other than the literal one can run under (the ablation varies one
#: knob against the literal reading); their sections of every reading join the report.
READING_EXPERIMENTS: tuple[str, ...] = ("table1", "clustering", "efficiency", "rh", "formation")
#: ``--dataset all``: the offline default, then the paper's four datasets.
ALL_DATASETS: tuple[str, ...] = ("digits", "mnist", "cifar10", "svhn", "cinic10")


@dataclass
class DatasetOutcome:
    """What happened for one dataset: its sections, or why it was skipped."""

    name: str
    budget: Budget | None = None
    sections: dict[str, Section] = field(default_factory=dict)
    skipped: str | None = None
    wall_seconds: float = 0.0
    runs_simulated: int = 0
    runs_cached: int = 0
    #: Sum of the runs' own wall times (s) as measured when they ran (cached runs included).
    compute_seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    test_samples: int = 0
    #: where the data came from, and in which layout (``Dataset.source``)
    source: str = ""


def parse_names(value: str, choices: tuple[str, ...], what: str, everything: tuple[str, ...]
                ) -> list[str]:
    """A comma-separated list (or ``all``) checked against ``choices``."""
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    if not names:
        raise ValueError(f"no {what} given")
    if names == ["all"]:
        return list(everything)
    bad = [n for n in names if n not in choices]
    if bad:
        raise ValueError(f"unknown {what} {bad[0]!r}; choose from {', '.join(choices)} or all")
    return list(dict.fromkeys(names))


def parse_datasets(value: str) -> list[str]:
    return parse_names(value, tuple(DATASETS), "dataset", ALL_DATASETS)


def parse_experiments(value: str) -> list[str]:
    names = parse_names(value, tuple(EXPERIMENTS), "experiment", NAMES)
    return [n for n in EXPERIMENTS if n in names]


def run_dataset(name: str, experiments: list[str], *, data_dir: str | None, budget: str,
                seeds: int | None, out: Path, progress: Any = None, fresh: bool = False,
                workers: int | None = 1, side_seeds: int | None = None, device: Any = "cpu",
                cache_only: bool = False,
                variants: list[str] | None = None, reading: str = LITERAL,
                executor: str | None = None, jobs: int = 1,
                cuda_graphs: bool = True) -> DatasetOutcome:
    """Every experiment in ``experiments`` on dataset ``name`` (skipped if its files are
    missing); ``workers``: processes training each run's clients (None: one per core);
    ``device``: where they train; ``cache_only``: simulate nothing (see
    :class:`~fedcure_app.experiments.runner.Runner`); ``variants``: simulate only these
    ablation variants (the others are read from the cache, or listed as not run yet);
    ``reading``: the reading of the paper's setting (:mod:`.readings`), whose sections go to
    ``<experiment>-<reading>/`` folders; ``executor``: the simulation's executor (None: the
    configuration's default); ``jobs``: runs simulated at once in separate processes;
    ``cuda_graphs``: the batched executor's CUDA graphs on a GPU (result-neutral). An
    ablation, or a section of another reading, written earlier for the same budget joins the
    outcome (read from its ``summary.json``) when it is not run now."""
    outcome = DatasetOutcome(name)
    t0 = time.perf_counter()
    try:
        dataset = load_dataset(name, data_dir)
    except DatasetError as err:
        outcome.skipped = str(err)
        log.warning("skipping %s: %s", name, err)
        return outcome
    b = get_budget(budget, name, seeds, side_seeds)
    outcome.budget = b
    outcome.source = dataset.source
    runner = Runner(dataset, out / name / "runs", progress=progress, fresh=fresh,
                    workers=workers, device=device, cache_only=cache_only, jobs=jobs,
                    parallel=run_parallel if jobs > 1 else None)
    ctx = Context(dataset=dataset, data_dir=data_dir, budget=b, out_dir=out / name,
                  runner=runner, reading=get_reading(reading),
                  extra={**({"executor": executor} if executor else {}),
                         **({} if cuda_graphs else {"cuda-graphs": False})})
    outcome.config = ctx.base().model_dump(mode="json", by_alias=True)
    outcome.config["data"].pop("data-dir", None)
    outcome.test_samples = min(dataset.test_size, b.eval_samples or dataset.test_size)
    for exp in experiments:
        module = EXPERIMENTS[exp]
        e0 = time.perf_counter()
        if exp == "ablation" and variants is not None:
            runner.run_all(module.plan(ctx, only=variants))
            runner.cache_only = True  # the other variants: from the cache or "not run yet"
            try:
                section = module.analyse(ctx)
            finally:
                runner.cache_only = cache_only
        else:
            runner.run_all(module.plan(ctx))
            section = module.analyse(ctx)
        section.wall_seconds = time.perf_counter() - e0
        section.reading = reading
        section.budget = b.name
        section.save(ctx.folder(exp))
        outcome.sections[ctx.reading.folder(exp)] = section
        log.info("%s/%s done in %.1f s", name, exp, section.wall_seconds)
    earlier_keys = [] if "ablation" in experiments else ["ablation"]
    earlier_keys += [r.folder(exp) for exp in READING_EXPERIMENTS for r in READINGS.values()
                     if r.name != reading]
    for key in earlier_keys:
        earlier = earlier_section(ctx.out_dir / key, b.name)
        if earlier is not None:
            outcome.sections[key] = earlier
    outcome.wall_seconds = time.perf_counter() - t0
    outcome.runs_simulated = runner.simulated
    outcome.runs_cached = runner.cached_hits
    outcome.compute_seconds = float(sum(r.get("wall_seconds", 0.0)
                                        for r in runner.results.values()))
    return outcome


def earlier_section(folder: Path, budget: str) -> Section | None:
    """The section an earlier run of an experiment saved in ``folder`` (its ``summary.json``
    and figures), if it ran at ``budget``; else None."""
    summary = ablation.load_summary(folder)
    if summary is None or (summary.get("budget")
                           or summary.get("data", {}).get("budget")) != budget:
        return None
    return Section(summary["experiment"], summary["title"], summary["dataset"],
                   summary["markdown"], [folder / f for f in summary["figures"]],
                   summary["data"], float(summary.get("wall_seconds", 0.0)),
                   summary.get("reading", LITERAL), budget)


__all__ = [
    "ALL_DATASETS", "DatasetOutcome", "EXPERIMENTS", "READING_EXPERIMENTS", "REPORT_ORDER",
    "earlier_section",
    "parse_datasets",
    "parse_experiments", "run_dataset",
]
