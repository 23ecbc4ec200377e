"""Deployed edge rounds: how much of an edge round is the clients' training, and how much is not.

Runs ``fedcure launch`` (the cloud, one edge with its Flower SuperLink, ``--clients``
clients with their SuperNodes, all real processes on 127.0.0.1) once per client runtime and
dataset, τ_c = ``--tau-c``, ``--rounds`` tasks of τ_e = ``--tau-e`` edge rounds:

- ``flower``: Flower's own path (today's before issue 12): ``flower-supernode`` with its 3 s idle
  sleep, ``flower-superexec``, one ``flwr-clientapp`` process per message;
- ``warm``: ``fedcure-client``'s default: the SuperNode with short idle waits
  (:mod:`client.supernode`) and one long-lived executor + trainer (:mod:`client.executor`).

Per edge round (from the edge's log, push to aggregate): wall seconds, the slowest client's
training seconds (measured compute, from each client's applied-directives log) and
overhead = wall − slowest training. Per message: ClientApp start (the ``flwr-clientapp``
process's start, or the warm executor taking the task) to reply. It prints medians and p95s,
the old/new overhead ratio, the goal for the warm runtime (median ≤ 0.15 s, p95 ≤ 0.4 s per
edge round) and the load average before and after (the goal is for an otherwise idle 2-core
machine). ``--busy`` runs one CPU-bound process beside the runs (started and stopped by PID).

Every run is traced (``FEDCURE_TRACE_DIR``, :mod:`fedcure_app.runtime.tracing`): the hop table
(:mod:`fedcure_app.runtime.hops`) says where each train message's time goes, from the edge
ServerApp's push through the SuperLink, the SuperNode, the executor and the trainer back to the
edge's pull, median and p95 per hop, and per edge round the edge's send, the slowest message, the
aggregation and the overhead.

``--profiles`` instead runs one ``fedcure launch --edges 2`` with the warm runtime and device
profiles that differ per coalition (slow ``rpi4`` clients at edge 0, fast ``laptop`` clients at
edge 1, formation ``none``), and prints T̂ (the cloud's latency estimate) per coalition and task
and the frequency directives each client was sent and applied.

    python3 bench/deploy_round.py [--datasets digits,mnist] [--data-dir DIR] [--clients 4]
        [--rounds 4] [--tau-e 4] [--tau-c 5] [--runtimes warm,flower] [--busy] [--out DIR]
    python3 bench/deploy_round.py --profiles [--out DIR]
    python3 bench/deploy_round.py --live [--pairs 3] [--with-load] [--out DIR]

``--live`` measures what the cloud's live view costs: pairs of the same digits launch (warm
runtime) without the live view (``--no-dashboard``) and with it on, its page fetched, its event
stream read the whole run and a real Prometheus (Debian's ``prometheus``) scraping ``/metrics``
every second; the order alternates within each pair. It prints the median overhead per edge
round (and the median edge round) of both, pooled over the pairs, and whether the live view's
is within 5 % of the plain one; ``--with-load`` repeats it with one extra CPU-bound process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ROUND_LINE = re.compile(r"task (\S+) edge round (\d+)/(\d+): ([0-9.]+) s wall")

#: the goal for the warm runtime: overhead per edge round (seconds, median and p95)
GOAL_MEDIAN_S, GOAL_P95_S = 0.15, 0.4


#: CPU seconds the last launch's process tree used (every role, Flower's processes included)
LAST_CPU_S = [0.0]
#: ... and per kind of process from the first edge round on (sampled from /proc every 0.25 s)
LAST_CPU_BY_KIND: dict[str, float] = {}
#: the last launch's CPU seconds by kind of process over the whole run, start-up included
LAST_RUN_CPU_BY_KIND: dict[str, float] = {}
#: process kind by a piece of its command line (first match wins)
KINDS = (("flower-superlink", "SuperLink"), ("held_superlink", "SuperLink"),
         ("flwr-serverapp", "edge ServerApp"),
         ("client.supernode", "SuperNode"), ("flower-supernode", "SuperNode"),
         ("client.executor", "executor"), ("client.trainer", "trainer"),
         ("flower-superexec", "executor"), ("flwr-clientapp", "trainer"),
         ("cloud_server", "cloud"), ("edge_server", "edge role"), ("client.cli", "client role"),
         ("fedcure-client", "client role"))


#: the kind of a process whose command line names none of :data:`KINDS`
OTHER_KIND = "launch/other"



def process_tree(root: int) -> dict[int, list[str]]:
    """The /proc/PID/stat fields after the command name, for ``root`` and every process under
    it (Linux): field 1 is the parent PID, 11 and 12 the user and system CPU ticks, 21 the
    resident pages."""
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stats[int(d)] = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
    mine, grew = {root}, True
    while grew:
        grew = False
        for pid, rest in stats.items():
            if pid not in mine and len(rest) > 1 and rest[1].isdigit() and int(rest[1]) in mine:
                mine.add(pid)
                grew = True
    return {pid: stats[pid] for pid in mine if pid in stats}


def kind_unsettled(known: str, parent_known: str | None) -> bool:
    """Whether a process's kind must be read again: unknown, an executor (a trainer forked
    from it keeps its command line until it names itself), or its parent's kind (read between
    fork and exec it shows the parent's command line: the edge role's SuperLink read then would
    stay "edge role")."""
    return known in ("", OTHER_KIND, "executor") or known == parent_known


def process_kind(pid: int) -> str | None:
    """The kind (:data:`KINDS`) of process ``pid`` from its command line, None when it is gone.
    A child read between fork and exec shows its parent's command line, so a caller looks again
    while the kind is "executor" or :data:`OTHER_KIND`; a trainer forked from its executor keeps
    the executor's command line and names itself instead."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return None
    return kind_of(cmd, name)


def kind_of(cmd: str, comm: str) -> str:
    """The kind of process a command line (and its ``comm`` name) names: :data:`KINDS`."""
    if comm == "fedcure-trainer":
        return "trainer"
    return next((k for part, k in KINDS if part in cmd), OTHER_KIND)


class CpuSampler:
    """CPU seconds of every process under ``root`` (Linux /proc), sampled in a thread."""

    def __init__(self, root: int, every_s: float = 0.25, trace_dir: Path | None = None) -> None:
        import threading

        self.root = root
        self.trace_dir = trace_dir
        #: per-process CPU seconds when the first edge round started (start-up before it)
        self.at_first_round: dict[int, float] | None = None
        self.every_s = every_s
        self.cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        for pid, rest in process_tree(self.root).items():
            try:
                seconds = (int(rest[11]) + int(rest[12])) / self._tick
                parent = int(rest[1])
            except (IndexError, ValueError):
                continue
            kind = self.cpu.get(pid, ("", 0.0))[0]
            if kind_unsettled(kind, self.cpu.get(parent, (None, 0.0))[0]):
                kind = process_kind(pid)
                if kind is None:
                    continue
            self.cpu[pid] = (kind, max(seconds, self.cpu.get(pid, ("", 0.0))[1]))

    def _first_round_started(self) -> bool:
        if self.trace_dir is None or not self.trace_dir.is_dir():
            return False
        return any("edge.round_start" in p.read_text(errors="replace")
                   for p in self.trace_dir.glob("edge*.jsonl"))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            if self.at_first_round is None and self._first_round_started():
                self.at_first_round = {pid: s for pid, (_, s) in self.cpu.items()}
            self._stop.wait(self.every_s)

    def by_kind(self, rounds_only: bool = False) -> dict[str, float]:
        """CPU seconds per process kind; ``rounds_only``: since the first edge round began."""
        base = (self.at_first_round or {}) if rounds_only else {}
        out: dict[str, float] = {}
        for pid, (kind, seconds) in self.cpu.items():
            out[kind] = out.get(kind, 0.0) + seconds - base.get(pid, 0.0)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def launch(out: Path, runtime: str, dataset: str, data_dir: str | None, args: argparse.Namespace,
           edges: int = 1, config: Path | None = None, extra: list[str] | None = None
           ) -> float:
    """One ``fedcure launch`` with ``FEDCURE_CLIENT_RUNTIME=runtime``; its wall seconds."""
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--edges", str(edges),
            "--clients", str(args.clients), "--rounds", str(args.rounds), "--dataset", dataset,
            "--tau-e", str(args.tau_e), "--tau-c", str(args.tau_c), "--lr", "0.05",
            "--eval-every", str(args.rounds), "--no-progress", "--timeout", str(args.timeout),
            "--out", str(out), *(extra or [])]
    if data_dir:
        argv += ["--data-dir", data_dir]
    if config is not None:
        argv += ["--config", str(config)]
    env = dict(os.environ, FEDCURE_CLIENT_RUNTIME=runtime, FEDCURE_TRACE_DIR=str(out / "trace"),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
                   "PYTHONPATH")])]))  # every role, Flower's own processes too, runs this tree
    t0 = time.monotonic()
    cpu0 = _children_cpu_s()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                text=True)
        sampler = CpuSampler(proc.pid, trace_dir=out / "trace")
        sampler.start()
        try:
            code = proc.wait(timeout=args.timeout + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            sampler.stop()
        err.seek(0)
        stderr = err.read()
    wall = time.monotonic() - t0
    LAST_CPU_S[0] = _children_cpu_s() - cpu0
    LAST_CPU_BY_KIND.clear()
    LAST_CPU_BY_KIND.update(sampler.by_kind(rounds_only=True))
    LAST_RUN_CPU_BY_KIND.clear()
    LAST_RUN_CPU_BY_KIND.update(sampler.by_kind())
    if code != 0:
        # the rounds it finished still count; the table says the run did not complete
        print(f"fedcure launch ({runtime}, {dataset}) failed with code {code}: "
              f"{(stderr.strip().splitlines() or ['no output'])[-1]}", flush=True)
        return -wall
    return wall


def collect(out: Path) -> dict[str, Any]:
    """Per edge round (wall, slowest training, overhead) and per message (start to reply)."""
    rounds: dict[tuple[str, int], float] = {}
    for log in sorted((out / "logs").glob("edge*.log")):
        for m in ROUND_LINE.finditer(log.read_text(errors="replace")):
            rounds[(m.group(1), int(m.group(2)))] = float(m.group(4))
    training: dict[tuple[str, int], float] = {}
    per_message: list[float] = []
    for applied in sorted((out / "work").glob("client*/node-data.npz.applied.jsonl")):
        for line in applied.read_text().splitlines():
            a = json.loads(line)
            key = (a["task"], int(a["edge_round"]))
            training[key] = max(training.get(key, 0.0), float(a["measured_s"]))
            if a.get("app_started_at") is not None and a.get("finished_at") is not None:
                per_message.append(float(a["finished_at"]) - float(a["app_started_at"]))
    keys = sorted(k for k in rounds if k in training)
    wall = np.array([rounds[k] for k in keys])
    slowest = np.array([training[k] for k in keys])
    got: dict[str, Any] = {
        "rounds": len(keys), "wall_s": wall.tolist(), "slowest_training_s": slowest.tolist(),
        "overhead_s": (wall - slowest).tolist(), "message_s": per_message, "hops": None}
    if (out / "trace").is_dir():
        from fedcure_app.runtime.hops import hop_table
        from fedcure_app.runtime.tracing import load_events

        msgs, per_round = hop_table(load_events(out / "trace"))
        got["hops"] = {"messages": [h.__dict__ for h in msgs],
                       "rounds": [h.__dict__ for h in per_round]}
    return got


def _stats(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    v = np.asarray(values)
    return float(np.median(v)), float(np.percentile(v, 95))


def busy_process() -> subprocess.Popen:
    """One CPU-bound process (a busy loop), to measure beside; stop it with :func:`stop`."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def stop(proc: subprocess.Popen) -> None:
    """Stop a process this script started, by its PID."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def rounds_bench(args: argparse.Namespace, out: Path) -> int:
    busy = busy_process() if args.busy else None
    try:
        return _rounds_bench(args, out, busy)
    finally:
        if busy is not None:
            stop(busy)


def _rounds_bench(args: argparse.Namespace, out: Path, busy: Any) -> int:
    from fedcure_app.runtime.hops import HopStats, format_table

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    results: dict[str, Any] = {"load_before": os.getloadavg(), "runs": [],
                               "busy_pid": None if busy is None else busy.pid,
                               "cpus": os.cpu_count()}
    if busy is not None:
        print(f"one CPU-bound process beside the runs (pid {busy.pid})", flush=True)
    for dataset in datasets:
        data_dir = (args.data_dir or args.mnist_dir) if dataset == "mnist" else None
        if dataset == "mnist" and not data_dir:
            print("mnist: skipped (no --data-dir)")
            continue
        for runtime in runtimes:
            run_out = out / f"{dataset}-{runtime}"
            load = os.getloadavg()[0]
            try:
                wall = launch(run_out, runtime, dataset, data_dir, args)
            except subprocess.TimeoutExpired:
                print(f"fedcure launch ({runtime}, {dataset}) did not end in time", flush=True)
                wall = -float(args.timeout)
            got = collect(run_out)
            got.update(dataset=dataset, runtime=runtime, launch_wall_s=wall,
                       load_at_start=load, cpu_s=LAST_CPU_S[0],
                       cpu_by_kind=dict(LAST_CPU_BY_KIND))
            results["runs"].append(got)
            print(f"{dataset:6s} {runtime:6s} launch {wall:6.1f} s, {got['rounds']} edge rounds",
                  flush=True)
    results["load_after"] = os.getloadavg()
    (out / "deploy_round.json").write_text(json.dumps(results, indent=1))

    print(f"\nper edge round (seconds; {args.clients} clients, tau_c {args.tau_c}, "
          f"{args.rounds} tasks x tau_e {args.tau_e}); load average "
          f"{results['load_before'][0]:.2f} before, {results['load_after'][0]:.2f} after")
    head = (f"{'dataset':7s} {'runtime':7s} {'rounds':>6s} {'wall med':>9s} {'train med':>9s} "
            f"{'ovh med':>8s} {'ovh p95':>8s} {'msg med':>8s} {'msg p95':>8s} {'launch':>7s}")
    print(head)
    print("-" * len(head))
    ok = True
    for dataset in datasets:
        runs = {r["runtime"]: r for r in results["runs"] if r["dataset"] == dataset}
        if "warm" in runs and runs["warm"]["rounds"]:
            om, op = _stats(runs["warm"]["overhead_s"])
            met = om <= GOAL_MEDIAN_S and op <= GOAL_P95_S
            ok = ok and met
            print(f"{dataset}: warm overhead per edge round {om:.3f} s median, {op:.3f} s p95; "
                  f"goal (median <= {GOAL_MEDIAN_S} s, p95 <= {GOAL_P95_S} s): "
                  f"{'met' if met else 'NOT met'}")
        for runtime, r in runs.items():
            wm, _ = _stats(r["wall_s"])
            tm, _ = _stats(r["slowest_training_s"])
            om, op = _stats(r["overhead_s"])
            mm, mp = _stats(r["message_s"])
            launch_s = (f"{r['launch_wall_s']:7.1f}" if r["launch_wall_s"] >= 0
                        else f"{-r['launch_wall_s']:6.0f}!")  # !: did not complete
            print(f"{dataset:7s} {runtime:7s} {r['rounds']:6d} {wm:9.3f} {tm:9.3f} {om:8.3f} "
                  f"{op:8.3f} {mm:8.3f} {mp:8.3f} {launch_s}")
        if any(not r["rounds"] for r in runs.values()):
            ok = False
            print(f"{dataset}: a run finished no edge round (see its logs); no comparison")
        elif "warm" in runs and "flower" in runs:
            old, _ = _stats(runs["flower"]["overhead_s"])
            new, _ = _stats(runs["warm"]["overhead_s"])
            ratio = old / new if new > 0 else float("inf")
            print(f"{dataset}: overhead per edge round flower {old:.3f} s -> warm {new:.3f} s "
                  f"median ({ratio:.1f}x less)")
    print("(launch: wall seconds of the whole fedcure launch; '!': it failed or timed out, the "
          "rounds it finished are counted)")
    for r in results["runs"]:
        if r.get("hops"):
            print(f"\nhop table: {r['dataset']}, {r['runtime']} runtime "
                  f"(load average {r['load_at_start']:.2f} at start; the launch's processes "
                  f"used {r['cpu_s']:.1f} CPU s, {r['cpu_s'] / max(1, r['rounds']):.2f} per "
                  "edge round)")
            n = max(1, r["rounds"])
            print("CPU seconds per edge round by process kind (from the first edge round on): "
                  + ", ".join(f"{k} {v / n:.3f}" for k, v in r.get("cpu_by_kind", {}).items()))
            print(format_table([HopStats(**h) for h in r["hops"]["messages"]],
                               [HopStats(**h) for h in r["hops"]["rounds"]]))
    print(f"\nresults in {out / 'deploy_round.json'}")
    return 0 if ok else 1


def profiles_bench(args: argparse.Namespace, out: Path) -> int:
    """Two coalitions of different emulated devices: T̂ and directives per coalition."""
    clients = args.clients
    slow, fast = "rpi4", "laptop"
    # formation none: client i stays at its initial edge; edge-noniid gives edge e the clients
    # e*n/2 .. (e+1)*n/2 - 1, so the first half is coalition 0 (slow), the rest coalition 1
    profiles = [slow if i < clients // 2 else fast for i in range(clients)]
    devices = out / "devices.toml"
    devices.write_text("".join(f'[[profiles]]\npreset = "{p}"\nname = "{p}-{i}"\n\n'
                               for i, p in enumerate(profiles)))
    config = out / "profiles.toml"
    config.write_text(f'[devices]\nprofiles-file = "{devices}"\n')
    run_out = out / "profiles"
    wall = launch(run_out, "warm", "digits", None, args, edges=2, config=config,
                  extra=["--formation", "none", "--partition", "iid", "--deadline-min", "600"])
    if not (run_out / "result.json").is_file():
        print(f"fedcure launch --edges 2 --clients {clients} wrote no result.json (logs in "
              f"{run_out / 'logs'})")
        return 1
    result = json.loads((run_out / "result.json").read_text())
    print(f"fedcure launch --edges 2 --clients {clients} (warm runtime): {wall:.1f} s; "
          f"coalitions {result.get('coalitions')}, device profiles {profiles}")
    print(f"{'round':>5s} {'coalition':>9s} {'T^ (s)':>8s} {'latency (s)':>11s}  directives (GHz)")
    for r in result["records"]:
        print(f"{r['round']:5d} {r['coalition']:9d} {r['estimate_s']:8.3f} "
              f"{r['latency_s']:11.3f}  "
              f"{ {int(c): round(f, 3) for c, f in r['frequencies_ghz'].items()} }")
    applied: dict[int, list[float]] = {}
    for c in range(clients):
        path = run_out / "work" / f"client{c}" / "node-data.npz.applied.jsonl"
        if path.is_file():
            applied[c] = [round(json.loads(x)["applied_ghz"], 3)
                          for x in path.read_text().splitlines()]
    print("applied per client (GHz):", applied)
    return 0


class LiveWatchers:
    """What watches a live view during a run: its page fetched once, its event stream read
    (a thread), and a Prometheus scraping ``/metrics`` every second (a process)."""

    def __init__(self, port: int, work: Path) -> None:
        import shutil
        import threading

        self.port = port
        self.events = 0
        self.bytes = 0
        self.page_ok = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self.prom_port = _free_port()
        self.prometheus = None
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("--live needs Debian's prometheus (apt-get install prometheus)")
        work.mkdir(parents=True, exist_ok=True)
        (work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: fedcure\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}']\n")
        self.prometheus = subprocess.Popen(
            [binary, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.prom_port}"],
            stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("w"))

    def _read(self) -> None:
        import http.client
        import socket

        while not self._stop.is_set():  # the cloud starts the view a moment after launch
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        try:
            for path in ("/", "/static/app.js", "/static/style.css"):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                self.page_ok = resp.status == 200
                conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            conn.request("GET", "/events")
            resp = conn.getresponse()
            while not self._stop.is_set():
                line = resp.fp.readline()
                if not line:
                    break
                self.bytes += len(line)
                if line.startswith(b"data: "):
                    self.events += 1
        except OSError:
            pass

    def scrapes(self) -> int:
        """Successful scrapes Prometheus stored (PromQL over its HTTP API)."""
        import urllib.parse
        import urllib.request

        q = urllib.parse.urlencode({"query": "sum(count_over_time(up{job='fedcure'}[1h]))"})
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.prom_port}/api/v1/query?{q}", timeout=5) as r:
                got = json.loads(r.read())["data"]["result"]
            return int(float(got[0]["value"][1])) if got else 0
        except OSError:
            return 0

    def stop(self) -> int:
        """Stop watching; the number of scrapes."""
        self._stop.set()
        n = self.scrapes()
        self.prometheus_cpu_s = _cpu_seconds(self.prometheus.pid) if self.prometheus else 0.0
        if self.prometheus is not None and self.prometheus.poll() is None:
            self.prometheus.terminate()
            self.prometheus.wait(30)
        self._thread.join(5)
        return n


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def live_bench(args: argparse.Namespace, out: Path) -> int:
    """The live view's cost per edge round (see the module docstring, ``--live``)."""
    results: dict[str, Any] = {"runs": []}
    loads = (False, True) if args.with_load else (False,)
    for loaded in loads:
        hog = None
        if loaded:  # one extra CPU-bound process, stopped by its PID below
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for i in range(args.pairs):
                for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    name = f"live-{'load' if loaded else 'idle'}-{i}-{mode}"
                    run_out = out / name
                    watchers = None
                    extra = ["--no-dashboard"]
                    if mode == "on":
                        port = _free_port()
                        watchers = LiveWatchers(port, out / f"{name}-watch")
                        extra = ["--dashboard", f"127.0.0.1:{port}"]
                    load0 = os.getloadavg()[0]
                    try:
                        wall = launch(run_out, "warm", "digits", None, args, extra=extra)
                    finally:
                        scrapes = watchers.stop() if watchers is not None else 0
                    cpu = LAST_RUN_CPU_BY_KIND.get("cloud", 0.0)
                    got = collect(run_out)
                    got.update(mode=mode, loaded=loaded, pair=i, launch_wall_s=wall,
                               load_at_start=load0, scrapes=scrapes,
                               events=watchers.events if watchers else 0,
                               event_bytes=watchers.bytes if watchers else 0,
                               page_ok=watchers.page_ok if watchers else None,
                               prometheus_cpu_s=watchers.prometheus_cpu_s if watchers else 0.0,
                               cloud_cpu_s=cpu)
                    results["runs"].append(got)
                    print(f"{name}: launch {wall:6.1f} s, {got['rounds']} edge rounds"
                          + f", cloud {cpu:.1f} CPU s"
                          + (f", {got['events']} events read, {scrapes} scrapes, "
                             f"Prometheus {got['prometheus_cpu_s']:.1f} CPU s"
                             if watchers else ""), flush=True)
        finally:
            if hog is not None:
                hog.terminate()
                hog.wait(10)
    (out / "deploy_round_live.json").write_text(json.dumps(results, indent=1))
    print(f"\nper edge round (seconds; {args.clients} clients, tau_c {args.tau_c}, "
          f"{args.rounds} tasks x tau_e {args.tau_e}, digits, warm runtime, {args.pairs} "
          "pairs pooled)")
    head = (f"{'host':6s} {'live view':9s} {'rounds':>6s} {'wall med':>9s} {'ovh med':>8s} "
            f"{'ovh p95':>8s} {'cloud CPU/round':>15s} {'events':>7s} {'scrapes':>7s} "
            f"{'Prom CPU':>8s}")
    print(head)
    print("-" * len(head))
    ok = True
    for loaded in loads:
        host = "loaded" if loaded else "idle"
        med: dict[str, float] = {}
        for mode in ("off", "on"):
            runs = [r for r in results["runs"] if r["loaded"] == loaded and r["mode"] == mode]
            wall = [x for r in runs for x in r["wall_s"]]
            ovh = [x for r in runs for x in r["overhead_s"]]
            wm, _ = _stats(wall)
            om, op = _stats(ovh)
            med[mode] = om
            done = [r for r in runs if r["rounds"]]
            cpu = (sum(r.get("cloud_cpu_s", 0.0) for r in done)
                   / max(1, sum(r["rounds"] for r in done)))
            print(f"{host:6s} {mode:9s} {len(ovh):6d} {wm:9.3f} {om:8.3f} {op:8.3f} "
                  f"{cpu:13.3f} s {sum(r['events'] for r in runs):7d} "
                  f"{sum(r['scrapes'] for r in runs):7d} "
                  f"{sum(r.get('prometheus_cpu_s', 0.0) for r in runs):6.1f} s")
        change = (med["on"] - med["off"]) / med["off"] if med["off"] > 0 else float("nan")
        within = abs(change) <= 0.05 or med["on"] <= med["off"]
        ok = ok and within
        print(f"{host}: median overhead per edge round {med['off']:.3f} s without the live "
              f"view, {med['on']:.3f} s with it ({100 * change:+.1f} %): "
              f"{'within' if within else 'NOT within'} 5 %")
    print(f"\nresults in {out / 'deploy_round_live.json'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="digits,mnist")
    p.add_argument("--data-dir", help="datasets folder for MNIST (as fedcure launch --data-dir)")
    p.add_argument("--mnist-dir", help=argparse.SUPPRESS)  # the old name of --data-dir
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4, help="tasks (global rounds)")
    p.add_argument("--tau-e", type=int, default=4)
    p.add_argument("--tau-c", type=int, default=5)
    p.add_argument("--runtimes", default="warm,flower")
    p.add_argument("--busy", action="store_true",
                   help="run one CPU-bound process beside the runs (started and stopped by PID)")
    p.add_argument("--timeout", type=float, default=900.0, help="per launch (s)")
    p.add_argument("--profiles", action="store_true",
                   help="two coalitions of different device profiles: T^ and directives")
    p.add_argument("--live", action="store_true",
                   help="the live view's cost: launches without and with it watched")
    p.add_argument("--pairs", type=int, default=3, help="--live: launch pairs per host state")
    p.add_argument("--with-load", action="store_true",
                   help="--live: also with one extra CPU-bound process")
    p.add_argument("--out", help="folder for the runs (default: a temporary one)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="deploy-round-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.live:
        return live_bench(args, out)
    return profiles_bench(args, out) if args.profiles else rounds_bench(args, out)


if __name__ == "__main__":
    raise SystemExit(main())
