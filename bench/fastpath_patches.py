"""The fast path, patch by patch: the single-edge floor with all patches on, then each off alone.

Runs ``fedcure launch --edges 1 --clients 2 --rounds 4 --tau-e 4 --dataset digits`` (real
processes on 127.0.0.1) once with every patch on, once per patch with
``FEDCURE_FASTPATH_OFF=<patch>`` (:data:`fedcure_app.flower.fastpath.gate.PATCHES`; ``lazy_sql``
is left out: it saves memory, not time) and once with the gate forced closed
(``FEDCURE_FASTPATH=off``, as on a Flower outside the supported range), and prints the median
edge round of each (the edge's log) and each patch's gain: the median with it off minus the
median with all on, and that as a share of the latter. The load average before and after each
run is printed beside it: the floor is a goal for an otherwise idle 2-core machine.

With ``--clients N`` each run is ``bench/edge_scale.py --clients N`` instead (one edge, N warm
clients, ``--rounds`` tasks of 4 edge rounds), and the table gives per run the median edge round,
its overhead (wall minus the slowest client's training) and the cores the SuperLink and the
SuperNodes take while the coalition waits; the gain is taken on the overhead. Runs that close
the gate are left out there (a 32-client round at Flower's 3 s poll).

    python3 bench/fastpath_patches.py [--patches object_pulls,held_pulls] [--out DIR]
    python3 bench/fastpath_patches.py --clients 32 [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
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


def scale(out: Path, env: dict[str, str], clients: int, rounds: int) -> dict:
    """``bench/edge_scale.py``'s row for one edge with ``clients`` clients, run into ``out``."""
    rows = out / "rows.json"
    argv = [sys.executable, str(ROOT / "bench" / "edge_scale.py"), "--clients", str(clients),
            "--rounds", str(rounds), "--idle-s", "6", "--settle-s", "4", "--json", str(rows),
            "--out", str(out)]
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=3600)
    if not rows.exists():  # (its exit code also says whether the N = 32 goals were met)
        raise SystemExit(f"edge_scale into {out} failed: {(done.stdout + done.stderr)[-500:]}")
    return json.loads(rows.read_text())["rows"][0]


def scale_table(out: Path, runs: list[tuple[str, dict[str, str]]], clients: int,
                rounds: int) -> None:
    """Print one row per run at ``clients`` clients, the gain taken on the overhead."""
    print("| run | wall median (s) | overhead median (s) | gain (% of all on) | "
          "waiting: SuperLink + SuperNodes (cores) | load before, after | problem |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    base = None
    for i, (name, env) in enumerate(runs):
        before = os.getloadavg()[0]
        row = scale(out / f"scale{i}", env, clients, rounds)
        after = os.getloadavg()[0]
        base = row["overhead_median_s"] if base is None else base
        gain = row["overhead_median_s"] - base
        print(f"| {name} | {row['wall_median_s']:.3f} | {row['overhead_median_s']:.3f} | "
              f"{100 * gain / base:+.0f} % | {row['idle_cores']:.3f} | {before:.1f}, {after:.1f} | "
              f"{row['problem']} |",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--patches", default=",".join(TIMED), help="patches to turn off one by one")
    p.add_argument("--out", type=Path, help="folder for the runs (default: a temporary one)")
    p.add_argument("--clients", type=int, help="run bench/edge_scale.py with N clients instead")
    p.add_argument("--rounds", type=int, default=2, help="tasks per run with --clients (>= 2)")
    args = p.parse_args(argv)
    if args.clients is not None and (args.clients < 1 or args.rounds < 2):
        p.error("--clients must be at least 1 and --rounds at least 2")
    patches = [x for x in args.patches.split(",") if x]
    unknown = sorted(set(patches) - set(PATCHES))
    if unknown:
        p.error(f"--patches: no such patch: {', '.join(unknown)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="fastpath-"))
    runs = [("all on", {}), *((f"{x} off", {PATCH_OFF_ENV: x}) for x in patches),
            ("gate closed", {FORCE_ENV: "off"})]
    if args.clients is not None:
        scale_table(out, runs[:-1], args.clients, args.rounds)
        return 0
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
