"""Memory of every role in a ``fedcure testbed`` run: PSS per process while the run trains.

Runs ``fedcure testbed --out DIR`` (root; its defaults unless arguments after ``--`` say
otherwise, e.g. ``-- --clients 12 --edges 4``) and samples, every ``--every`` seconds, the
proportional set size (PSS, ``Pss`` of ``/proc/<pid>/smaps_rollup``: a page shared by k
processes counts 1/k in each) of every process under the testbed, classified by its command
line into a role (client, edge, cloud, testbed) and a process kind (:data:`KINDS`).

The training window runs from the first global round's arrival (the cloud's log says
``round 1/``: every trainer has started and trained once) to the end of training
(``training over``). Per process the median of its samples in the window is taken; the table
gives, per kind, the mean of those medians over the processes of that kind (MiB each), each
role's sum per instance (per client, per edge), and the largest sum over all processes taken
at the same instant.

    sudo python3 bench/testbed_memory.py [--every 1] [--out DIR] [--json FILE] [-- TESTBED ARGS]

MiB = 2^20 bytes. It prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from footprint import ROOT, children_of, cmdline, comm, pss_bytes, tree  # noqa: E402

#: (role, kind, what the table calls it, command-line needles), in table order; the first match
#: wins. A trainer forked from its executor keeps the executor's command line but is named
#: ``fedcure-trainer`` (client.forked), so it is told apart by that name.
KINDS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("client", "role", "`fedcure-client`", ("client.cli", "client.partition")),
    ("client", "supernode", "its Flower SuperNode (`client.supernode`)", ("client.supernode",)),
    ("client", "trainer", "its trainer (`client.trainer`, torch)", ("client.trainer",)),
    ("client", "executor", "its executor (`client.executor`)", ("client.executor",)),
    ("edge", "role", "`fedcure-edge`", ("edge_server.cli",)),
    ("edge", "superlink", "its SuperLink", ("held_superlink", "flower-superlink")),
    ("edge", "serverapp", "its ServerApp (`flwr-serverapp`)", ("flwr-serverapp",)),
    ("edge", "superexec", "its SuperExec", ("flower-superexec",)),
    ("cloud", "role", "`fedcure-cloud`", ("cloud_server.cli",)),
    ("testbed", "monitor", "status monitor", ("fedcure_app.testbed.monitor",)),
    ("testbed", "proxy", "live-view proxy", ("fedcure_app.testbed.proxy",)),
    ("testbed", "testbed", "`fedcure testbed` itself", ("fedcure_app.cli testbed",)),
)
MIB = 1 << 20


def classify(cmd: str, name: str) -> tuple[str, str] | None:
    """(role, kind) of a process from its command line and comm, or None (not ours: ``ip``,
    ``tc``, shells)."""
    if name == "fedcure-trainer":
        return "client", "trainer"
    for role, kind, _, needles in KINDS:
        if any(n in cmd for n in needles):
            return role, kind
    return None


def label(role: str, kind: str) -> str:
    return next(t for r, k, t, _ in KINDS if (r, k) == (role, kind))


def sample(root_pid: int) -> dict[int, tuple[str, str, int]]:
    """pid -> (role, kind, PSS bytes) for every classified process under ``root_pid`` now."""
    out = {}
    for p in tree(root_pid, children_of()):
        what = classify(cmdline(p), comm(p))
        size = pss_bytes(p) if what else None
        if what and size is not None:
            out[p] = (*what, size)
    return out


def measure(out: Path, every_s: float, extra: list[str], timeout_s: float) -> dict[str, Any]:
    """One testbed run; its samples and the training window (seconds since the start)."""
    run_dir = out / "run"
    cmd = [sys.executable, "-m", "fedcure_app.cli", "testbed", "--out", str(run_dir),
           "--no-progress", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cloud_log = run_dir / "logs" / "cloud.log"
    series: list[tuple[float, dict[int, tuple[str, str, int]]]] = []
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    with open(out / "testbed.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    raise SystemExit(f"the testbed ran past {timeout_s:.0f} s; stopped it")
                now = time.monotonic() - t0
                series.append((now, sample(proc.pid)))
                text = cloud_log.read_text(errors="replace") if cloud_log.is_file() else ""
                if "start" not in marks and "round 1/" in text:
                    marks["start"] = now
                if "end" not in marks and "training over" in text:
                    marks["end"] = now
                time.sleep(every_s)
        finally:
            if proc.poll() is None:
                proc.send_signal(2)  # SIGINT: the testbed removes its namespaces and cgroups
                proc.wait(120)
    if proc.returncode != 0:
        raise SystemExit(f"fedcure testbed failed (exit {proc.returncode}); see "
                         f"{out / 'testbed.log'}")
    if "start" not in marks or "end" not in marks:
        raise SystemExit(f"no training window in {cloud_log}")
    return {"series": series, "marks": marks}


def summarise(series: list[tuple[float, dict[int, tuple[str, str, int]]]],
              marks: dict[str, float]) -> dict[str, Any]:
    """Per (role, kind): processes and mean of their window medians (bytes); per role: its
    instances (clients, edges); the largest same-instant total (bytes)."""
    window = [s for t, s in series if marks["start"] <= t <= marks["end"]]
    if not window:
        raise SystemExit("no sample fell inside the training window; lower --every")
    per_pid: dict[int, tuple[str, str, list[int]]] = {}
    for s in window:
        for pid, (role, kind, size) in s.items():
            per_pid.setdefault(pid, (role, kind, []))[2].append(size)
    kinds: dict[tuple[str, str], list[float]] = {}
    for role, kind, sizes in per_pid.values():
        kinds.setdefault((role, kind), []).append(statistics.median(sizes))
    instances = {role: len(v) for (role, kind), v in kinds.items() if kind == "role"}
    rows = []
    for role, kind, _, _ in KINDS:
        vals = kinds.get((role, kind))
        if vals is None:
            continue
        n = instances.get(role, 1) or 1
        rows.append({"role": role, "kind": kind, "processes": len(vals),
                     "each": sum(vals) / len(vals), "per_instance": sum(vals) / n})
    total = max(sum(size for _, _, size in s.values()) for s in window)
    return {"rows": rows, "instances": instances, "peak_total": total,
            "window_s": marks["end"] - marks["start"], "samples": len(window)}


def table(summary: dict[str, Any]) -> str:
    """The docs' table: MiB each per process kind, and per client / per edge in bold."""
    lines = ["| role | processes | MiB each (PSS) |", "| --- | --- | ---: |"]
    for role in ("client", "edge", "cloud", "testbed"):
        rows = [r for r in summary["rows"] if r["role"] == role]
        for i, r in enumerate(rows):
            lines.append(f"| {role if i == 0 else ''} | {label(role, r['kind'])} "
                         f"({r['processes']}) | {r['each'] / MIB:.0f} |")
        if role in ("client", "edge") and rows:
            per = sum(r["per_instance"] for r in rows)
            lines.append(f"| | **per {role}** | **{per / MIB:.0f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before giving up")
    p.add_argument("--out", help="folder for the run (default: a temporary one)")
    p.add_argument("--json", help="also write the summary and every sample here")
    args = p.parse_args(own)
    if os.geteuid() != 0:
        p.error("the testbed needs root (network namespaces, cgroups)")
    if not 0.05 <= args.every <= 60:
        p.error("--every must be in [0.05, 60] seconds")
    out = Path(args.out or tempfile.mkdtemp(prefix="fedcure-bench-tbmem-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    run = measure(out, args.every, extra, args.timeout)
    summary = summarise(run["series"], run["marks"])
    print(table(summary))
    print(f"\n{summary['instances'].get('client', 0)} clients, "
          f"{summary['instances'].get('edge', 0)} edges; all processes together at most "
          f"{summary['peak_total'] / (1 << 30):.2f} GiB (same instant) over "
          f"{summary['window_s']:.0f} s of training, {summary['samples']} samples")
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.1f}, after {load1[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            summary | {"marks": run["marks"], "load": [load0, load1],
                       "series": [(t, {str(k): v for k, v in s.items()})
                                  for t, s in run["series"]]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
