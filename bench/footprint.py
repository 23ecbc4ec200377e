"""Memory of one deployed client: PSS of each of its processes, idle and at peak.

Runs ``fedcure launch --edges 1 --clients 2 --rounds R --dataset D`` (the cloud, one edge and
two ``fedcure-client`` processes on 127.0.0.1, warm runtime) and samples, every ``--every``
seconds, the proportional set size (PSS, ``Pss`` of ``/proc/<pid>/smaps_rollup``: a page shared
by k processes counts 1/k in each) of client 0's role process and every process under it,
classified by their command lines: ``role`` (``client.cli``), ``supernode``
(``client.supernode``), ``executor`` (``client.executor``), ``trainer`` (``client.trainer``, or
the process named ``fedcure-trainer``: a trainer forked from its executor keeps the executor's
command line, :mod:`client.forked`).

- **idle**: the last sample after the client registered (``registration.json`` in its work
  folder) and its trainer said it was ready, before its executor took its first task
  (``executor.log``); when no sample fell in that window, the first one after registration;
- **each page once** (last row, as root only): the distinct resident pages of the client's
  processes (``/proc/<pid>/pagemap``), each counted once and whole, sampled every fourth time:
  what the client would hold alone on a board, where no other process shares torch's or
  Flower's library pages (PSS splits those with the launch's other client and edge);
- **peak**: while training (from the start to the sample after the executor logged its last
  task done), each process's largest sample, and the largest sum over the client's processes
  taken at the same instant (which is what the 400 MB goal counts). The samples of the shutdown
  after it are left out of the table: as the trainer and the executor exit, the pages they
  shared are counted whole in the one still mapping them, and a sum read across processes that
  are exiting counts some pages twice. The whole run's largest sum, shutdown included, is
  printed below the table.

    python3 bench/footprint.py [--datasets digits,mnist,own28] [--data-dir DIR] [--rounds 12]
        [--every 0.25] [--out DIR] [--json FILE]

``own28`` is two clients of the per-client-folder example on their own data (28×28 images,
``--task``/``--clients-data``). It prints one table per dataset (MB = 10^6 bytes) and the load average before and after; the
goal line says whether the client's peak total stays within ``--goal-mb`` (400). ``--json``
also keeps every sample (``series``: seconds since the launch started, PSS bytes per kind).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: process kinds, in the order the table lists them; matched against each command line
KINDS: tuple[tuple[str, str], ...] = (
    ("trainer", "client.trainer"),
    ("executor", "client.executor"),
    ("supernode", "client.supernode"),
    ("role", "client.cli"),
    ("role", "client.partition"),  # the role's child that cuts its partition, then exits
)


def children_of() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(d))
    return out


def tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    """``pid`` and every process under it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pss_bytes(pid: int) -> int | None:
    """``Pss`` of ``/proc/<pid>/smaps_rollup`` in bytes (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def comm(pid: int) -> str:
    """``/proc/<pid>/comm`` (the process name; empty when the process is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def kind_of(cmd: str, name: str = "") -> str | None:
    """The kind of a process from its command line (``name``: its comm)."""
    if name == "fedcure-trainer":
        return "trainer"
    for kind, needle in KINDS:
        if f"-m {needle}" in cmd or f"{needle.replace('.', '/')}.py" in cmd:
            return kind
    return None


def find_client(launch_pid: int, name: str) -> int | None:
    """The pid of ``fedcure-client --name NAME`` under the launch process."""
    for p in tree(launch_pid, children_of()):
        cmd = cmdline(p)
        if "client.cli" in cmd and f"--name {name} " in cmd + " ":
            return p
    return None


#: the sample key of the client's resident pages counted once (see :func:`pages_once`)
ONCE = "once"
PAGE = os.sysconf("SC_PAGE_SIZE")
#: pagemap entry bits: page present, and the page frame number
_PRESENT, _PFN_MASK = 1 << 63, (1 << 55) - 1
#: address ranges larger than this are not read (reservations, never resident as a whole)
_MAX_RANGE = 1 << 36


def resident_frames(pid: int) -> Any:
    """The page frame numbers of ``pid``'s resident pages (``/proc/<pid>/pagemap``; a NumPy
    array), or None when the process is gone or the frames are hidden (not root)."""
    import numpy as np

    frames = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            ranges = [tuple(int(a, 16) for a in line.split()[0].split("-")) for line in f]
        with open(f"/proc/{pid}/pagemap", "rb") as pm:
            for lo, hi in ranges:
                if hi - lo > _MAX_RANGE:
                    continue
                pm.seek(lo // PAGE * 8)
                try:
                    entries = np.frombuffer(pm.read((hi - lo) // PAGE * 8), dtype="<u8")
                except OSError:  # [vsyscall] and the like
                    continue
                frames.append(entries[(entries & _PRESENT) != 0] & _PFN_MASK)
    except (OSError, ValueError):
        return None
    out = np.concatenate(frames) if frames else np.zeros(0, dtype="<u8")
    return None if out.size and not out.any() else out


def pages_once(pids: list[int]) -> int | None:
    """Bytes of the distinct resident pages of ``pids`` together: each page they map counted
    once, however many of them map it, and in full, however many other processes on the host
    map it too. That is the memory they would hold alone on a board, where nothing else loaded
    torch or Flower; PSS instead splits a shared library's pages with the other client and the
    edge of the launch. None without root (the frame numbers read as 0)."""
    import numpy as np

    frames = [f for f in (resident_frames(p) for p in pids) if f is not None]
    if not frames:
        return None
    return int(np.unique(np.concatenate(frames)).size) * PAGE


def sample(client_pid: int, once: bool = False) -> dict[str, int]:
    """PSS (bytes) per kind of the client's processes now (kinds summed when repeated); with
    ``once``, also :func:`pages_once` of those processes under :data:`ONCE`."""
    out: dict[str, int] = {}
    mine = []
    for p in tree(client_pid, children_of()):
        kind = kind_of(cmdline(p), comm(p))
        size = pss_bytes(p)
        if kind is None or size is None:
            continue
        out[kind] = out.get(kind, 0) + size
        mine.append(p)
    if once and mine:
        together = pages_once(mine)
        if together is not None:
            out[ONCE] = together
    return out


#: the ``--datasets`` name of the clients' own data: two clients of the per-client-folder
#: example (``examples/digits_folders.py``, 28×28 greyscale PNGs), ``--task`` and
#: ``--clients-data``
OWN = "own28"


def own_data_args(out: Path) -> list[str]:
    """Write the two clients' folders and their task under ``out``; launch's options."""
    clients, task = out / "own28-clients", out / "own28-task.toml"
    if not clients.exists():
        subprocess.run([sys.executable, str(ROOT / "examples" / "digits_folders.py"),
                        str(clients), "--clients", "2", "--classes-per-client", "5"],
                       check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "fedcure_app.cli", "task", "init", str(clients),
                        "--out", str(task), "--force"], check=True, capture_output=True)
    return ["--task", str(task), "--clients-data", str(clients)]


def pss_total(s: dict[str, int]) -> int:
    """The PSS sum of one sample (the processes' kinds, not :data:`ONCE`)."""
    return sum(v for k, v in s.items() if k != ONCE)


def measure(dataset: str, data_dir: str | None, rounds: int, every_s: float, out: Path,
            timeout_s: float) -> dict[str, Any]:
    """One launch; the samples of client 0 and the idle/peak figures."""
    run_dir = out / dataset
    cmd = [sys.executable, "-m", "fedcure_app.cli", "launch", "--edges", "1",
           "--rounds", str(rounds), "--out", str(run_dir),
           "--no-dashboard", "--no-progress", "--timeout", str(timeout_s)]
    if dataset == OWN:
        cmd += own_data_args(out)
    else:
        cmd += ["--clients", "2", "--dataset", dataset]
    if data_dir and dataset != OWN:
        cmd += ["--data-dir", data_dir]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    work = run_dir / "work" / "client0"
    samples: list[tuple[float, dict[str, int]]] = []
    marks: dict[str, float] = {}
    tasks_done = 0
    t0 = time.monotonic()
    with open(out / f"launch-{dataset}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        client = None
        try:
            while proc.poll() is None:
                now = time.monotonic() - t0
                if client is None:
                    client = find_client(proc.pid, "client-0")
                if client is not None:
                    s = sample(client, once=len(samples) % 4 == 0)
                    if s:
                        samples.append((now, s))
                exe_log = work / "executor.log"
                text = exe_log.read_text() if exe_log.is_file() else ""
                if "registered" not in marks and (work / "registration.json").is_file():
                    marks["registered"] = now
                if "ready" not in marks and "ready" in text:
                    marks["ready"] = now
                if "first_task" not in marks and "to the trainer" in text:
                    marks["first_task"] = now
                done = text.count(": completed in ")
                if done > tasks_done:  # a task finished since the last sample
                    tasks_done, marks["last_done"] = done, now
                time.sleep(every_s)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    if proc.returncode != 0:
        raise SystemExit(f"fedcure launch failed (exit {proc.returncode}); see "
                         f"{out / f'launch-{dataset}.log'}")
    return summarise(samples, marks) | {"dataset": dataset, "rounds": rounds,
                                        "samples": len(samples), "series": samples}


def summarise(samples: list[tuple[float, dict[str, int]]], marks: dict[str, float]
              ) -> dict[str, Any]:
    """Idle (see the module docstring) and peak PSS per kind and in total (bytes)."""
    kinds = list(dict.fromkeys(k for k, _ in KINDS))
    reg = marks.get("registered")
    ready = max(reg or 0.0, marks.get("ready", 0.0))
    first = marks.get("first_task", float("inf"))
    idle_s = [s for t, s in samples if reg is not None and ready <= t < first]
    if not idle_s:
        idle_s = [s for t, s in samples if reg is not None and t >= reg][:1]
    idle = idle_s[-1] if idle_s else {}
    end = marks.get("last_done", float("inf"))
    training = [s for t, s in samples if t <= end]
    peak = {k: max((s.get(k, 0) for s in training), default=0) for k in kinds}
    total_peak = max((pss_total(s) for s in training), default=0)
    idle_once = [s[ONCE] for s in idle_s if ONCE in s]
    return {"idle": {**{k: idle.get(k, 0) for k in kinds}, "total": pss_total(idle),
                     ONCE: idle_once[-1] if idle_once else None},
            "peak": {**peak, "total": total_peak,
                     ONCE: max((s[ONCE] for s in training if ONCE in s), default=None)},
            "marks": marks,
            "run_peak_total": max((pss_total(s) for _, s in samples), default=0)}


def table(results: list[dict[str, Any]], goal_mb: float) -> str:
    """Markdown table: one row per process kind and the total, idle and peak per dataset."""
    head = "| process | " + " | ".join(f"{r['dataset']} idle | {r['dataset']} peak"
                                       for r in results) + " |"
    rule = "| --- |" + " ---: | ---: |" * len(results)
    rows = [head, rule]
    labels = {"total": "**all (same instant)**", ONCE: "all, each page once (alone on a board)"}
    for kind in [*dict.fromkeys(k for k, _ in KINDS), "total", ONCE]:
        cells = [" | ".join("-" if r[w].get(kind) is None else f"{r[w][kind] / 1e6:.0f}"
                            for w in ("idle", "peak")) for r in results]
        rows.append(f"| {labels.get(kind, kind)} | " + " | ".join(cells) + " |")
    lines = ["\n".join(rows), ""]
    for r in results:
        ok = r["peak"]["total"] / 1e6 <= goal_mb
        lines.append(f"{r['dataset']}: client peak {r['peak']['total'] / 1e6:.0f} MB PSS, goal "
                     f"<= {goal_mb:.0f} MB: {'met' if ok else 'NOT met'} "
                     f"({r['samples']} samples; whole run with the shutdown: "
                     f"{r['run_peak_total'] / 1e6:.0f} MB)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="digits,mnist")
    p.add_argument("--data-dir", help="dataset folder (mnist needs its IDX files there)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    p.add_argument("--goal-mb", type=float, default=400.0)
    p.add_argument("--timeout", type=float, default=900.0, help="per launch (s)")
    p.add_argument("--out", help="folder for the launches (default: temporary)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="fedcure-footprint-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    results = [measure(d.strip(), args.data_dir, args.rounds, args.every, out, args.timeout)
               for d in args.datasets.split(",") if d.strip()]
    load1 = os.getloadavg()
    print(table(results, args.goal_mb))
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f}, after {load1[0]:.2f} "
          f"{load1[1]:.2f}; launches in {out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "load_before": load0,
                                               "load_after": load1}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
