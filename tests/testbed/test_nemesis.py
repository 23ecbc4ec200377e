"""The nemesis (bench/nemesis.py): its schedule is a function of the seed alone and keeps its
rules (no test needs root), and a 2-minute seed passes every invariant on a live testbed
federation (root, only with ``FEDCURE_TESTBED_TESTS=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.nemesis import Fault, role_names, schedule
from tests.kernel import require_netns

ROOT = Path(__file__).resolve().parents[2]
#: the CI seed and its length (seconds of faults)
CI_SEED, CI_SECONDS = 1, 120.0


def test_a_seed_replays_its_schedule_and_another_seed_draws_another():
    assert schedule(7, 120.0) == schedule(7, 120.0)
    assert schedule(7, 120.0) != schedule(8, 120.0)


def test_the_ci_seed_mixes_every_kind_of_fault_and_several_at_once():
    faults = schedule(CI_SEED, CI_SECONDS)
    kinds = Counter((f.kind, f.targets[0].rstrip("0123456789")) for f in faults
                    if f.kind == "kill")
    assert {k for _, k in kinds} == {"cloud", "edge", "client"}
    assert {f.kind for f in faults} == {"kill", "cut", "slow"}
    overlapping = [(a, b) for i, a in enumerate(faults) for b in faults[i + 1:]
                   if b.at_s < a.end_s]
    assert len(overlapping) >= 3
    assert any(a.at_s == b.at_s for a, b in overlapping)  # started at the same moment


def _rules_hold(faults: list[Fault], seconds: float, edges: int, clients: int) -> None:
    names = set(role_names(edges, clients))
    assert faults == sorted(faults, key=lambda f: f.at_s)
    for i, f in enumerate(faults):
        assert 0 < f.at_s and f.end_s <= seconds + 1e-9
        assert set(f.targets) <= names and len(set(f.targets)) == len(f.targets)
        if f.kind == "cut":
            a, b = (t.rstrip("0123456789") for t in f.targets)
            assert {a, b} != {"client"} and {a, b} != {"edge"}, f  # two roles that talk
        for g in faults[i + 1:]:
            if g.at_s >= f.end_s + (1.0 if f.kind == "kill" else 0.0):
                continue
            # a role is not killed (or cut from the same peer) while it is down or cut
            if f.kind == "kill":
                assert not (g.kind == "kill" and g.targets == f.targets), (f, g)
                assert not (g.kind != "kill" and f.targets[0] in g.targets
                            and g.at_s < f.end_s + 1.0), (f, g)
            if g.kind == f.kind and g.targets == f.targets:
                raise AssertionError(f"{f} and {g} overlap on the same targets")


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), seconds=st.floats(10.0, 900.0),
       edges=st.integers(1, 4), clients=st.integers(1, 9))
def test_every_schedule_keeps_its_rules(seed, seconds, edges, clients):
    _rules_hold(schedule(seed, seconds, edges, clients), seconds, edges, clients)


@pytest.mark.skipif(os.environ.get("FEDCURE_TESTBED_TESTS") != "1",
                    reason="a 2-minute nemesis run on a live testbed (root): set "
                           "FEDCURE_TESTBED_TESTS=1")
def test_the_ci_seed_passes_every_invariant(tmp_path):
    stdout = run_nemesis(tmp_path, "--seconds", str(CI_SECONDS), "--seed", str(CI_SEED))
    assert "every invariant holds" in stdout


def run_nemesis(tmp_path: Path, *args: str, timeout_s: float = 1800.0) -> str:
    """``bench/nemesis.py ARGS`` (root); asserts exit 0 and returns its standard output."""
    require_netns()
    from tests.interrupts import end_process

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "nemesis.py"), *args, "--out",
         str(tmp_path / "nemesis")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    finally:  # Ctrl-C or the timeout: SIGTERM, so that it tears its federation down
        end_process(proc, grace_s=90.0)
    print(stdout[-8000:], stderr[-4000:], sep="\n")
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    return stdout


def test_the_hostile_checks_pass_only_when_the_liar_counts_and_the_shifter_is_dropped():
    from bench.nemesis import LIAR, SHIFTER, hostile_checks

    clients = [{"name": f"client-{i}", "id": i, "edge": i % 2, "samples": 300} for i in range(4)]
    clients[LIAR]["samples"] = 300_000
    records = [{"coalition": SHIFTER % 2, "task_id": f"t{k}", "dropped": [SHIFTER]}
               for k in range(3)] + [{"coalition": 1 - SHIFTER % 2, "task_id": "u", "dropped": []}]
    assert all(ok for _, ok, _ in hostile_checks({"clients": clients, "records": records}))
    records[1]["dropped"] = []  # one task aggregated the shifted model
    clients[LIAR]["samples"] = 300  # the forged count was not taken
    assert not any(ok for _, ok, _ in hostile_checks({"clients": clients, "records": records}))


@pytest.mark.skipif(os.environ.get("FEDCURE_TESTBED_TESTS") != "1",
                    reason="a nemesis run with two hostile clients on a live testbed (root): "
                           "set FEDCURE_TESTBED_TESTS=1")
def test_a_forged_count_and_a_shifted_update_keep_every_invariant(tmp_path):
    stdout = run_nemesis(tmp_path, "--seconds", "30", "--seed", str(CI_SEED), "--hostile",
                         timeout_s=1200.0)
    assert "PASS  the liar's forged count is registered" in stdout
    assert "PASS  the shifted client is dropped" in stdout
    assert "every invariant holds" in stdout
