"""Edges at fleet scale: one edge serving N clients, what its rounds cost and what idle costs.

For each N (``--clients 4,8,16,32``, or one N) it runs ``fedcure launch --edges 1 --clients N``
(the cloud, one edge with its Flower SuperLink and ServerApp, N warm clients, all real processes
on 127.0.0.1; digits, the default τ_c, ``--rounds`` tasks of τ_e = ``--tau-e`` edge rounds) and
measures:

- per edge round (the edge's log and the clients' applied-directive logs): the wall time, the
  slowest client's training and the overhead between them, median and p95;
- CPU cores per kind of process (SuperLink, edge ServerApp, SuperNodes, executors, trainers,
  cloud, roles), sampled from /proc every ``--every`` seconds, over two windows: **training**
  (from the first edge round to the end of the last one, the pause left out) and **waiting**:
  during the first task the bench stops the cloud (SIGSTOP, by PID), so once the coalition has
  finished that task and sent its update it waits for its next one, as a coalition does while
  another holds the schedule; ``--idle-s`` seconds of that wait are measured (from
  ``--settle-s`` seconds after the task's last edge round), then the cloud
  goes on (SIGCONT) and the run completes. The cloud's own cores in that window are 0 by
  construction;
- the edge's memory: the largest resident set of its SuperLink, ServerApp and role together.

It prints a table, writes a plot (overhead and cores against N) and, with ``--json FILE``,
``{"rows": [{"clients": N, "overhead_median_s": ..., "overhead_p95_s": ..., "idle_cores": ...
(SuperLink + all SuperNodes while the coalition waits), "train_superlink_cores": ..., ...}]}``.
``--busy`` runs one CPU-bound process beside the runs (started and stopped by PID).

    python3 bench/edge_scale.py [--clients 4,8,16,32] [--rounds 4] [--tau-e 4] [--busy]
        [--idle-s 12] [--settle-s 2] [--json FILE] [--plot FILE] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from deploy_round import (  # noqa: E402
    OTHER_KIND, busy_process, collect, kind_unsettled, process_kind, process_tree, stop)

ROUND_LINE = re.compile(r"task (\S+) edge round (\d+)/(\d+): ([0-9.]+) s wall")
#: the kinds that make up the edge machine (memory)
EDGE_KINDS = ("SuperLink", "edge ServerApp", "edge role")
#: the kinds whose waiting cost the goal bounds
IDLE_KINDS = ("SuperLink", "SuperNode")
#: the goals at N = 32 (digits, an otherwise idle 2-core machine)
GOAL_OVERHEAD_MEDIAN_S, GOAL_IDLE_CORES, GOAL_TRAIN_SUPERLINK_CORES = 1.0, 0.1, 0.5


class Sampler:
    """Per-process CPU seconds and resident memory of every process under ``root``, sampled
    from /proc every ``every_s`` seconds into a time series."""

    def __init__(self, root: int, every_s: float = 0.5) -> None:
        self.root = root
        self.every_s = every_s
        self.kind: dict[int, str] = {}
        #: (monotonic time, {pid: cpu seconds}, {kind: resident bytes})
        self.series: list[tuple[float, dict[int, float], dict[str, int]]] = []
        self._tick = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        cpu: dict[int, float] = {}
        rss: dict[str, int] = {}
        for pid, rest in process_tree(self.root).items():
            if kind_unsettled(self.kind.get(pid, OTHER_KIND), self.kind.get(int(rest[1]))):
                kind = process_kind(pid)  # between fork and exec: the parent's command line
                if kind is None:
                    continue
                self.kind[pid] = kind
            cpu[pid] = (int(rest[11]) + int(rest[12])) / self._tick
            k = self.kind[pid]
            rss[k] = rss.get(k, 0) + int(rest[21]) * self._page
        self.series.append((time.monotonic(), cpu, rss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)

    def cores(self, t0: float, t1: float) -> dict[str, float]:
        """Cores used per kind between the samples nearest ``t0`` and ``t1`` (monotonic s)."""
        if not self.series or t1 <= t0:
            return {}
        a = min(self.series, key=lambda s: abs(s[0] - t0))
        b = min(self.series, key=lambda s: abs(s[0] - t1))
        span = b[0] - a[0]
        if span <= 0:
            return {}
        out: dict[str, float] = {}
        for pid, seconds in b[1].items():
            k = self.kind.get(pid, OTHER_KIND)
            # a process born inside the window counts from 0; one that died is not in b
            out[k] = out.get(k, 0.0) + max(0.0, seconds - a[1].get(pid, 0.0)) / span
        return out

    def peak_rss(self, kinds: tuple[str, ...]) -> int:
        """The largest resident set of ``kinds`` together at one sample (bytes)."""
        return max((sum(r.get(k, 0) for k in kinds) for _, _, r in self.series), default=0)


class Pauser:
    """Stops the cloud (SIGSTOP) during the first task, waits until the coalition has finished
    that task, measures ``idle_s`` seconds of waiting, then lets the cloud go on (SIGCONT)."""

    def __init__(self, log_dir: Path, sampler: Sampler, idle_s: float, settle_s: float = 2.0,
                 cloud_pid: Any = None) -> None:
        self.log_dir = log_dir
        self.sampler = sampler
        self.idle_s = idle_s
        self.settle_s = settle_s
        self._cloud_pid = cloud_pid
        self.stopped_at: float | None = None
        self.idle: tuple[float, float] | None = None
        self.resumed_at: float | None = None
        #: (time the bench saw it, task, round, of, wall s) per edge round line
        self.rounds: list[tuple[float, str, int, int, float]] = []
        self.problem = ""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._cont()

    def _read_rounds(self) -> None:
        seen = {(r[1], r[2]) for r in self.rounds}
        now = time.monotonic()
        for log in sorted(self.log_dir.glob("edge*.log")):
            for m in ROUND_LINE.finditer(log.read_text(errors="replace")):
                key = (m.group(1), int(m.group(2)))
                if key not in seen:
                    seen.add(key)
                    self.rounds.append((now, key[0], key[1], int(m.group(3)),
                                        float(m.group(4))))

    def _cloud(self) -> int | None:
        pids = [p for p, k in list(self.sampler.kind.items()) if k == "cloud"]
        if not pids:  # not classified yet: read the tree's command lines now
            pids = [p for p in process_tree(self.sampler.root) if process_kind(p) == "cloud"]
        return min(pids) if pids else None

    def _cont(self) -> None:
        pid = self._cloud_pid
        if pid is not None and self.resumed_at is None and self.stopped_at is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.resumed_at = time.monotonic()

    def _wait(self, until: Any, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while not self._done.is_set() and time.monotonic() < end:
            self._read_rounds()
            if until():
                return True
            self._done.wait(0.2)
        return False

    def _run(self) -> None:
        if not self._wait(lambda: bool(self.rounds), 3600):
            return
        self._cloud_pid = self._cloud()
        if self._cloud_pid is None:
            self.problem = "no cloud process found"
            return
        first = self.rounds[0]  # edge rounds count from 0: k/τ_e ends the task at k = τ_e - 1
        if first[2] >= first[3] - 1:
            self.problem = "the first task ended before the bench could stop the cloud"
            return
        os.kill(self._cloud_pid, signal.SIGSTOP)
        self.stopped_at = time.monotonic()
        # the coalition finishes its task (its last round line) and sends its update
        if not self._wait(lambda: any(r[2] == r[3] - 1 for r in self.rounds), 600):
            self.problem = "the first task did not end while the cloud was stopped"
            self._cont()
            return
        n_rounds = len(self.rounds)
        if self._done.wait(self.settle_s):
            return
        t0 = time.monotonic()
        if self._done.wait(self.idle_s):
            return
        self.idle = (t0, time.monotonic())
        self._read_rounds()
        if len(self.rounds) != n_rounds:
            self.problem = "edge rounds ran while the cloud was stopped"
        self._cont()
        # the rounds after the pause: when the bench saw each bounds the second training window
        while not self._done.wait(0.2):
            self._read_rounds()


def launch(out: Path, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``fedcure launch --edges 1 --clients N`` with the pause; its measurements."""
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--edges", "1",
            "--clients", str(clients), "--rounds", str(args.rounds), "--dataset", "digits",
            "--tau-e", str(args.tau_e), "--eval-every", str(args.rounds), "--no-progress",
            "--no-dashboard", "--timeout", str(args.timeout), "--out", str(out)]
    env = dict(os.environ, FEDCURE_CLIENT_RUNTIME="warm",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
                   "PYTHONPATH")])]))
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                text=True)
        sampler = Sampler(proc.pid, every_s=args.every)
        pauser = Pauser(out / "logs", sampler, args.idle_s, args.settle_s)
        sampler.start()
        pauser.start()
        try:
            code = proc.wait(timeout=args.timeout + 300)
        except subprocess.TimeoutExpired:
            code = None
            proc.kill()
            proc.wait()
        except KeyboardInterrupt:  # Ctrl-C: the cloud goes on, then the launch stops its roles
            pauser.stop()
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
            raise
        finally:
            pauser.stop()
            sampler.stop()
        err.seek(0)
        tail = (err.read().strip().splitlines() or ["no output"])[-1]
    got = collect(out)
    rounds = sorted(pauser.rounds)
    row: dict[str, Any] = {"clients": clients, "rounds": got["rounds"],
                           "launch_s": round(time.monotonic() - t0, 1),
                           "completed": code == 0, "problem": pauser.problem or (
                               "" if code == 0 else f"launch exit {code}: {tail}")}
    for name, values in (("wall", got["wall_s"]), ("slowest_training", got["slowest_training_s"]),
                         ("overhead", got["overhead_s"])):
        v = np.asarray(values, dtype=float)
        row[f"{name}_median_s"] = float(np.median(v)) if v.size else None
        row[f"{name}_p95_s"] = float(np.percentile(v, 95)) if v.size else None
    # training windows: from the first round's start to the stop, and from the resume (the
    # first round after it) to the last round's end
    train: dict[str, float] = {}
    span = 0.0
    if rounds:
        start = rounds[0][0] - rounds[0][4]
        windows = []
        stop_at = pauser.stopped_at
        if stop_at is None:
            windows.append((start, rounds[-1][0]))
        else:
            windows.append((start, stop_at))
            after = [r for r in rounds if r[0] > (pauser.resumed_at or float("inf"))]
            if after:
                windows.append((after[0][0] - after[0][4], after[-1][0]))
        for a, b in windows:
            for k, c in sampler.cores(a, b).items():
                train[k] = train.get(k, 0.0) + c * (b - a)
            span += max(0.0, b - a)
    row["train_cores_by_kind"] = {k: round(v / span, 4) for k, v in train.items()} if span else {}
    row["train_superlink_cores"] = row["train_cores_by_kind"].get("SuperLink")
    idle = sampler.cores(*pauser.idle) if pauser.idle else {}
    row["idle_cores_by_kind"] = {k: round(v, 4) for k, v in idle.items()}
    row["idle_cores"] = (round(sum(idle.get(k, 0.0) for k in IDLE_KINDS), 4) if idle else None)
    row["idle_s"] = round(pauser.idle[1] - pauser.idle[0], 1) if pauser.idle else None
    row["edge_rss_mb"] = round(sampler.peak_rss(EDGE_KINDS) / 1e6, 1)
    row["load_after"] = round(os.getloadavg()[0], 2)
    return row


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "—" if v is None else format(v, spec)


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rows."""
    lines = ["| clients | edge rounds | wall (median) | slowest training (median) | overhead "
             "median | overhead p95 | waiting: SuperLink + SuperNodes (cores) | training: "
             "SuperLink | training: SuperNodes | training: edge ServerApp | edge RSS (MB) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        t = r["train_cores_by_kind"]
        lines.append(
            f"| {r['clients']} | {r['rounds']} | {_fmt(r['wall_median_s'])} | "
            f"{_fmt(r['slowest_training_median_s'])} | {_fmt(r['overhead_median_s'])} | "
            f"{_fmt(r['overhead_p95_s'])} | {_fmt(r['idle_cores'])} | "
            f"{_fmt(t.get('SuperLink'))} | {_fmt(t.get('SuperNode'))} | "
            f"{_fmt(t.get('edge ServerApp'))} | {_fmt(r['edge_rss_mb'], '.0f')} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Overhead (median, p95) and cores (waiting, training SuperLink) against N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["clients"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (("overhead_median_s", "median"), ("overhead_p95_s", "p95")):
        a.plot(n, [r[key] if r[key] is not None else np.nan for r in rows], "o-", label=label)
    a.axhline(GOAL_OVERHEAD_MEDIAN_S, ls=":", c="gray", label="goal (median, N = 32)")
    a.set(xlabel="clients at the edge", ylabel="overhead per edge round (s)", xscale="log")
    b.plot(n, [r["idle_cores"] if r["idle_cores"] is not None else np.nan for r in rows], "o-",
           label="waiting: SuperLink + SuperNodes")
    b.plot(n, [r["train_superlink_cores"] if r["train_superlink_cores"] is not None else np.nan
               for r in rows], "s-", label="training: SuperLink")
    b.plot(n, [r["train_cores_by_kind"].get("SuperNode", np.nan) for r in rows], "^-",
           label="training: SuperNodes")
    b.set(xlabel="clients at the edge", ylabel="CPU cores", xscale="log")
    for ax in (a, b):
        if len(n) < 2:
            ax.set_xscale("linear")
        ax.set_xticks(n, [str(x) for x in n])
        ax.minorticks_off()
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="4,8,16,32", help="N, or a comma-separated list")
    p.add_argument("--rounds", type=int, default=4, help="tasks (global rounds)")
    p.add_argument("--tau-e", type=int, default=4)
    p.add_argument("--idle-s", type=float, default=12.0, help="seconds of waiting measured")
    p.add_argument("--settle-s", type=float, default=2.0,
                   help="seconds after the task's last edge round before the waiting is measured")
    p.add_argument("--every", type=float, default=0.5, help="seconds between /proc samples")
    p.add_argument("--timeout", type=float, default=1800.0, help="per launch (s)")
    p.add_argument("--busy", action="store_true", help="one CPU-bound process beside the runs")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--plot", help="plot file (default: OUT/edge_scale.png)")
    p.add_argument("--out", help="folder for the runs (default: a temporary one)")
    args = p.parse_args(argv)
    try:
        ns = [int(x) for x in args.clients.split(",") if x.strip()]
    except ValueError:
        p.error(f"--clients: a number or a comma-separated list, got {args.clients!r}")
    if not ns or min(ns) < 1:
        p.error("--clients: at least one client")
    if args.rounds < 2 or args.tau_e < 2:
        p.error("--rounds and --tau-e must be >= 2 (the bench pauses inside the first task)")
    out = Path(args.out or tempfile.mkdtemp(prefix="edge-scale-"))
    out.mkdir(parents=True, exist_ok=True)
    busy = busy_process() if args.busy else None
    rows: list[dict[str, Any]] = []
    try:
        if busy is not None:
            print(f"one CPU-bound process beside the runs (pid {busy.pid})", flush=True)
        for n in ns:
            row = launch(out / f"clients-{n}", n, args)
            rows.append(row)
            print(f"N = {n:3d}: {row['rounds']} edge rounds, overhead median "
                  f"{_fmt(row['overhead_median_s'])} s, waiting {_fmt(row['idle_cores'])} "
                  f"cores, training SuperLink {_fmt(row['train_superlink_cores'])} cores"
                  + (f" ({row['problem']})" if row["problem"] else ""), flush=True)
    finally:
        if busy is not None:
            stop(busy)
    state = "beside one CPU-bound process" if args.busy else "otherwise idle"
    print(f"\none edge, digits, {args.rounds} tasks x tau_e {args.tau_e}, {os.cpu_count()} "
          f"cores, {state}:")
    print(table(rows))
    for r in rows:
        print(f"N = {r['clients']}: waiting by kind {r['idle_cores_by_kind']}; training by kind "
              f"{r['train_cores_by_kind']}")
    plot_path = Path(args.plot) if args.plot else out / "edge_scale.png"
    plot(rows, plot_path, f"one edge, digits, {state}")
    print(f"plot: {plot_path}")
    if args.json:
        Path(args.json).write_text(json.dumps({"busy": args.busy, "cpus": os.cpu_count(),
                                               "rows": rows}, indent=1))
        print(f"rows: {args.json}")
    ok = all(r["completed"] and not r["problem"] for r in rows)
    for r in rows:
        if r["clients"] == 32 and not args.busy:
            met = ((r["overhead_median_s"] or 1e9) <= GOAL_OVERHEAD_MEDIAN_S
                   and (r["idle_cores"] if r["idle_cores"] is not None else 1e9)
                   <= GOAL_IDLE_CORES
                   and (r["train_superlink_cores"] or 1e9) <= GOAL_TRAIN_SUPERLINK_CORES)
            print(f"goal at N = 32 (overhead median <= {GOAL_OVERHEAD_MEDIAN_S} s, waiting <= "
                  f"{GOAL_IDLE_CORES} core, training SuperLink <= "
                  f"{GOAL_TRAIN_SUPERLINK_CORES} core): {'met' if met else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
