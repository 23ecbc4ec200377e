"""The fast path, patch by patch: the single-edge floor with all patches on, then each off alone.

Runs ``fedcure launch --edges 1 --clients 2 --rounds 4 --tau-e 4 --dataset digits`` (real
processes on 127.0.0.1) once with every patch on, once per patch with
``FEDCURE_FASTPATH_OFF=<patch>`` (:data:`fedcure_app.flower.fastpath.gate.PATCHES`; ``lazy_sql``
is left out: it saves memory, not time) and once with the gate forced closed
(``FEDCURE_FASTPATH=off``, as on a Flower outside the supported range), and prints the median
edge round of each (the edge's log) and each patch's gain: the median with it off minus the
median with all on, and that as a share of the latter. The load average before and after each
run is printed beside it: the floor is a goal for an otherwise idle 2-core machine.

    python3 bench/fastpath_patches.py [--patches object_pulls,held_pulls] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedcure_app.flower.fastpath.gate import FORCE_ENV, PATCH_OFF_ENV, PATCHES  # noqa: E402

ROUND_LINE = re.compile(r"task \S+ edge round \d+/\d+: ([0-9.]+) s wall")
TIMED = tuple(p for p in PATCHES if p != "lazy_sql")


def floor(out: Path, env: dict[str, str]) -> list[float]:
    """Every edge round's wall seconds of one single-edge floor launch into ``out``."""
    run_env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
               "FLWR_HOME": str(out / "flwr-home"), **env}
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--edges", "1", "--clients", "2",
            "--rounds", "4", "--tau-e", "4", "--dataset", "digits", "--no-progress",
            "--no-dashboard", "--timeout", "600", "--out", str(out)]
    done = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"launch into {out} failed: {done.stderr[-500:]}")
    text = "".join(p.read_text() for p in sorted((out / "logs").glob("edge*.log")))
    return [float(s) for s in ROUND_LINE.findall(text)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--patches", default=",".join(TIMED), help="patches to turn off one by one")
    p.add_argument("--out", type=Path, help="folder for the runs (default: a temporary one)")
    args = p.parse_args(argv)
    patches = [x for x in args.patches.split(",") if x]
    unknown = sorted(set(patches) - set(PATCHES))
    if unknown:
        p.error(f"--patches: no such patch: {', '.join(unknown)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="fastpath-"))
    runs = [("all on", {}), *((f"{x} off", {PATCH_OFF_ENV: x}) for x in patches),
            ("gate closed", {FORCE_ENV: "off"})]
    base = None
    print("| run | median edge round (s) | gain (s) | gain (% of all on) | load before, after |")
    print("| --- | ---: | ---: | ---: | --- |")
    for i, (name, env) in enumerate(runs):
        before = os.getloadavg()[0]
        median = statistics.median(floor(out / f"run{i}", env))
        after = os.getloadavg()[0]
        base = median if base is None else base
        gain = median - base
        print(f"| {name} | {median:.3f} | {gain:+.3f} | {100 * gain / base:+.0f} % | "
              f"{before:.1f}, {after:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
