"""The single-edge floor (``fedcure launch --edges 1 --clients 2 --rounds 4 --tau-e 4 --dataset
digits``, real processes) both ways. With the fast path on (the installed Flower is in the
supported range) the launch says so and its edge rounds are far below stock Flower's 3 s poll
(median at most :data:`ON_MEDIAN_S`: a patch that silently stopped working shows here). Never
silently slow: with the fast path forced off (``FEDCURE_FASTPATH=off``: Flower runs unchanged,
as on a Flower outside the range) it finishes, says so in one warning line of its output, and
keeps its edge rounds near stock Flower's own 3 s poll (median at most :data:`OFF_MEDIAN_S`)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from fedcure_app.flower.fastpath.gate import FORCE_ENV

#: the median edge round with the gate closed (seconds): Flower's own 3 s SuperNode idle sleep,
#: its 0.5 s reply poll and its unbatched requests (measured 3.92 s on an otherwise idle 2-core
#: machine; Flower's own flwr-clientapp path takes about 10.8 s, docs/benchmarks.md)
OFF_MEDIAN_S = 4.5
#: the median edge round with the fast path on (seconds; about 0.1 on an idle 2-core machine)
ON_MEDIAN_S = 1.0
ROUND_LINE = re.compile(r"task \S+ edge round \d+/\d+: ([0-9.]+) s wall")


def edge_rounds(out: Path) -> list[float]:
    """Every edge round's wall seconds, from the edges' logs."""
    text = "".join(p.read_text() for p in sorted((out / "logs").glob("edge*.log")))
    return [float(s) for s in ROUND_LINE.findall(text)]


def floor(out: Path, **env: str) -> subprocess.CompletedProcess:
    """The single-edge floor into ``out``, with ``env`` added to the environment."""
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--edges", "1", "--clients", "2",
            "--rounds", "4", "--tau-e", "4", "--dataset", "digits", "--timeout", "400",
            "--no-progress", "--no-dashboard", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=480,
                          env={k: v for k, v in {**os.environ, **env}.items() if v})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_launch_with_the_fast_path_on_says_so_and_rounds_fast(tmp_path: Path):
    out = tmp_path / "launch"
    done = floor(out, **{FORCE_ENV: ""})
    assert sum("fast path on" in ln for ln in done.stderr.splitlines()) == 1, done.stderr
    assert "fast path off" not in done.stderr
    rounds = edge_rounds(out)
    assert len(rounds) == 4 * 4
    assert statistics.median(rounds) <= ON_MEDIAN_S, rounds


def test_a_launch_with_the_fast_path_off_warns_once_and_rounds_at_stock_speed(tmp_path: Path):
    out = tmp_path / "launch"
    done = floor(out, **{FORCE_ENV: "off"})
    warnings = [ln for ln in done.stderr.splitlines() if "fast path off" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("warning: Flower "), done.stderr
    assert FORCE_ENV in warnings[0]
    assert json.loads((out / "result.json").read_text())["rounds"] == 4
    rounds = edge_rounds(out)
    assert len(rounds) == 4 * 4
    assert statistics.median(rounds) <= OFF_MEDIAN_S, rounds
    for role in ("edge0", "client0", "client1"):  # each role's own output says it once too
        log = (out / "logs" / f"{role}.log").read_text()
        assert log.count("fast path off") == 1, role
