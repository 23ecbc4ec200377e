"""Nemesis (in the manner of Jepsen's): random, overlapping faults on a live testbed federation,
then the invariants of its history.

Root only: ``fedcure testbed``'s own code (``tests/testbed/federation.py``) starts a cloud, 2
edges and 4 clients (2 per edge, both coalitions training at once) in network namespaces. For
``--seconds`` the nemesis follows a schedule drawn from ``--seed`` (:func:`schedule`, printed
first, so a seed replays it): at random times it

- ``kill``s a role with SIGKILL, the cloud, an edge or a client (with every process it started,
  as when its machine dies), and starts it again after a random down time (the cloud with
  ``--resume``);
- ``cut``s two roles apart silently (``netns.cut``) and heals the cut after a random time;
- ``slow``s a role's link to a crawl (``tbf`` at :data:`CRAWL_MBPS`) and puts its rates back;

and often starts one fault while others last (several at once). After the last fault heals it
waits for every coalition to be aggregated again, then lets the run complete: the cloud is
killed once more and resumed with ``--rounds`` a few past its last checkpoint, so that it ends
by itself and every edge and client stops by itself. Then it checks and prints:

- the run completes (the cloud exits 0 with ``result.json`` complete; every edge and client
  exits 0 by itself; no role ever exited unless the nemesis killed it);
- versions 1..N, each accepted update aggregated once (``version_problems``);
- nothing acknowledged is lost: every update an edge was told was aggregated is in the history
  at that round (``lost_updates``);
- the final model is the last checkpoint's global model, bit for bit.

``--hostile`` adds two hostile clients for the whole run (``bench/hostile/sitecustomize.py``):
client :data:`LIAR` registers a forged count (1000× its histogram and samples, consistent, so
registration takes it) and says 10⁹ examples in every reply; client :data:`SHIFTER` answers
every edge round with its model shifted by 10 on every weight. Besides the invariants above it
checks that the liar's count was registered as forged (its weight is then capped at
``max-client-weight`` of its coalition) and that the shifter is dropped from every task of its
coalition, whose edge goes on.

Exit status 0 when every check passes, 1 when one fails, 2 on a usage error.

    sudo python3 bench/nemesis.py [--seconds 120] [--seed 1] [--out DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the fault kinds
KINDS = ("kill", "cut", "slow")
#: what a link slowed to a crawl carries, Mbit/s (both ways)
CRAWL_MBPS = 0.1
#: edges and clients of the federation (2 per edge)
EDGES, CLIENTS = 2, 4
#: seconds: per-edge-round reply deadline; the shortest task deadline
EDGE_TIMEOUT, DEADLINE_MIN = 5.0, 15.0
#: seconds: the longest wait for anything (start-up, recovery, the end) on a loaded host
PATIENCE = 240.0
#: rounds the resumed cloud runs past its last checkpoint before it ends the run
FINAL_ROUNDS = 2 * EDGES
#: ``--hostile``: the client that forges its count, the one that shifts its updates
LIAR, SHIFTER = 0, 3

CONFIG = f"""
[reliability]
deadline-slack = 1.0
first-deadline-s = 90.0
deadline-min-s = {DEADLINE_MIN}
"""


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``targets`` (role names) from ``at_s`` (seconds after the
    nemesis starts) for ``hold_s`` seconds (a kill's down time, a cut's or a crawl's length)."""

    at_s: float
    kind: str
    targets: tuple[str, ...]
    hold_s: float

    @property
    def end_s(self) -> float:
        return self.at_s + self.hold_s

    def describe(self) -> str:
        what = {"kill": "SIGKILL {0}, restart after", "cut": "cut {0} | {1}, heal after",
                "slow": "slow {0} to a crawl for"}[self.kind].format(*self.targets)
        return f"t={self.at_s:6.1f}s  {what} {self.hold_s:.1f}s"


def role_names(edges: int, clients: int) -> list[str]:
    """The roles of a federation: ``cloud``, ``edge<m>``, ``client<i>``."""
    return ["cloud", *(f"edge{m}" for m in range(edges)), *(f"client{i}" for i in range(clients))]


def schedule(seed: int, seconds: float, edges: int = EDGES, clients: int = CLIENTS,
             every_s: float = 8.0) -> list[Fault]:
    """The faults of a run of ``seconds``, drawn from ``seed`` alone (sorted by start).

    Starts are a Poisson process of mean gap ``every_s``; one start in three comes with a
    second fault at the same moment (several at once). Kinds and targets are uniform; a role
    is never killed while it is down and a pair never cut twice at once; cuts fall between two
    roles that talk (not two clients, not two edges); the first faults go
    through every kind (and a kill of the cloud, of an edge and of a client) before any kind
    repeats. Down times are 0.5–5 s, cuts 2–30 s (past the edge timeout and sometimes past a
    task's deadline), crawls 5–20 s; every fault ends by ``seconds``."""
    rng = random.Random(seed)
    names = role_names(edges, clients)
    # the pairs that talk: cloud-edge, cloud-client (registration, status), edge-client
    links = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
             if not (a.startswith("client") and b.startswith("client"))
             and not (a.startswith("edge") and b.startswith("edge"))]
    busy: dict[tuple[str, ...], float] = {}
    todo = [("kill", "cloud"), ("kill", "edge"), ("kill", "client"), ("cut", None),
            ("slow", None)]
    rng.shuffle(todo)
    out: list[Fault] = []
    t = rng.uniform(2.0, every_s)
    while True:
        for _ in range(2 if rng.random() < 1 / 3 else 1):
            kind, group = todo.pop(0) if todo else (rng.choice(KINDS), None)
            hold = {"kill": rng.uniform(0.5, 5.0), "cut": rng.uniform(2.0, 30.0),
                    "slow": rng.uniform(5.0, 20.0)}[kind]
            if t + hold > seconds:
                continue
            if kind == "cut":
                pool = list(links)
                rng.shuffle(pool)
            else:
                pool = [(n,) for n in names if group is None or n.startswith(group)]
                rng.shuffle(pool)
            free = [p for p in pool
                    if all(busy.get((n,), 0.0) <= t for n in p) and busy.get(p, 0.0) <= t]
            if not free:
                continue
            targets = free[0]
            busy[targets] = t + hold
            if kind == "kill":
                busy[targets] = t + hold + 1.0  # and until it is up again
            out.append(Fault(round(t, 2), kind, targets, round(hold, 2)))
        t += rng.expovariate(1.0 / every_s)
        if t >= seconds:
            return sorted(out, key=lambda f: f.at_s)


# ------------------------------------------------------------------------------ the run
def say(text: str, t0: float | None = None) -> None:
    """One line of the nemesis's account, with the seconds since ``t0``."""
    stamp = f"[{time.monotonic() - t0:7.1f}s] " if t0 is not None else ""
    print(f"nemesis: {stamp}{text}", flush=True)


class Nemesis:
    """Applies a schedule to a started :class:`tests.testbed.federation.Federation`."""

    def __init__(self, fed: Any) -> None:
        self.fed = fed
        #: role name -> exit codes the nemesis did not cause
        self.died: dict[str, int] = {}
        #: roles the nemesis killed and has not restarted yet
        self.down: set[str] = set()
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                        GRPC_VERBOSITY=os.environ.get("GRPC_VERBOSITY", "NONE"))
        self.argv = {c.name: list(c.argv) for c in fed.roles.all()}
        #: --hostile: two hostile clients run (the extra checks of :func:`hostile_checks`)
        self.hostile = False

    # ------------------------------------------------------------------ roles
    def child(self, name: str) -> Any:
        roles = self.fed.roles
        if name == "cloud":
            return roles.cloud
        kind, i = re.match(r"(edge|client)(\d+)$", name).groups()  # type: ignore[union-attr]
        return (roles.edges if kind == "edge" else roles.clients)[int(i)]

    def _set_child(self, name: str, child: Any) -> None:
        roles = self.fed.roles
        if name == "cloud":
            roles.cloud = child
        else:
            kind, i = re.match(r"(edge|client)(\d+)$", name).groups()  # type: ignore[union-attr]
            (roles.edges if kind == "edge" else roles.clients)[int(i)] = child

    def node(self, name: str) -> Any:
        plan = self.fed.plan
        if name == "cloud":
            return plan.cloud
        kind, i = re.match(r"(edge|client)(\d+)$", name).groups()  # type: ignore[union-attr]
        return (plan.edges if kind == "edge" else plan.clients)[int(i)]

    def watch(self) -> None:
        """Note every role that exited without the nemesis killing it."""
        for name in self.argv:
            if name in self.down or name in self.died:
                continue
            code = self.child(name).poll()
            if code is not None:
                self.died[name] = code
                say(f"{name} exited by itself with code {code}")

    def kill(self, name: str) -> None:
        """SIGKILL a role and everything it started (its machine dies)."""
        from fedcure_app.runtime.processes import descendants

        child = self.child(name)
        pids = [child.pid, *descendants(child.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.proc.wait(30)
        self.down.add(name)

    def restart(self, name: str, extra: list[str] | None = None) -> None:
        """Start a killed role again with its command line (the cloud with ``--resume``)."""
        from fedcure_app.runtime.processes import Child

        old = self.child(name)  # dead and reaped (its log handle stays open until the end)
        argv = self.argv[name] + (["--resume"] if name == "cloud" else []) + (extra or [])
        self._set_child(name, Child(name, argv, log_path=old.log_path, env=self.env))
        self.down.discard(name)

    # ------------------------------------------------------------------ faults
    def begin(self, f: Fault) -> None:
        from fedcure_app.testbed import netns

        if f.kind == "kill":
            self.kill(f.targets[0])
        elif f.kind == "cut":
            netns.cut(self.node(f.targets[0]), self.node(f.targets[1]))
        else:
            netns.shape(self.fed.plan, self.node(f.targets[0]), CRAWL_MBPS, CRAWL_MBPS)

    def end(self, f: Fault) -> None:
        from fedcure_app.testbed import netns

        if f.kind == "kill":
            self.restart(f.targets[0])
        elif f.kind == "cut":
            netns.cut(self.node(f.targets[0]), self.node(f.targets[1]), cut=False)
        else:
            n = self.node(f.targets[0])
            netns.shape(self.fed.plan, n, n.up_mbps, n.down_mbps)

    def run(self, faults: list[Fault], seconds: float) -> None:
        """Apply ``faults`` on their schedule (every fault ends by ``seconds``)."""
        events = sorted([(f.at_s, 1, i, f) for i, f in enumerate(faults)]
                        + [(f.end_s, 0, i, f) for i, f in enumerate(faults)],
                        key=lambda e: (e[0], e[1], e[2]))
        t0 = time.monotonic()
        for at, starts, _, f in events:
            while time.monotonic() - t0 < at:
                self.watch()
                time.sleep(min(0.2, max(0.0, at - (time.monotonic() - t0))))
            (self.begin if starts else self.end)(f)
            say(("begin " if starts else "end   ") + f.describe(), t0)
        while time.monotonic() - t0 < seconds:
            self.watch()
            time.sleep(0.2)


# ------------------------------------------------------------------------------ the end
def told(fed: Any) -> list[tuple[str, int]]:
    """(task, round) of every answer an edge was told was aggregated."""
    return [(t, int(m.group(1))) for e in range(EDGES) for t, reply in fed.answered(e)
            if (m := re.match(r"aggregated as round (\d+)", reply))]


def finish(nem: Nemesis, t0: float) -> int:
    """Let the run complete: the cloud killed and resumed with ``--rounds`` a few past its
    last checkpoint; waits for it and every edge and client to exit by themselves. Returns
    the rounds it ran to."""
    from cloud_server.checkpoint import CheckpointStore

    fed = nem.fed
    nem.kill("cloud")
    version = int(CheckpointStore(fed.out / "checkpoint").load()[0]["strategy"]["version"])
    target = version + FINAL_ROUNDS
    argv = nem.argv["cloud"]
    at = argv.index("--rounds")
    nem.argv["cloud"] = argv[:at + 1] + [str(target)] + argv[at + 2:]
    nem.restart("cloud")
    say(f"the end: cloud killed at version {version}, resumed to end at round {target}", t0)
    end = time.monotonic() + PATIENCE
    while time.monotonic() < end and any(c.poll() is None for c in fed.roles.all()):
        time.sleep(0.5)
    return target


def checks(nem: Nemesis, target: int) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) of every invariant."""
    from cloud_server.checkpoint import CheckpointStore
    from fedcure_app.protocol.codec import decode_arrays
    from tests.deployment.invariants import lost_updates, same_model, version_problems

    fed = nem.fed
    out: list[tuple[str, bool, str]] = []
    codes = {c.name: c.poll() for c in fed.roles.all()}
    result_path = fed.out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    records = result.get("records", [])
    out.append(("the run completes", codes.get("cloud") == 0 and bool(result.get("complete"))
                and len(records) == target,
                f"cloud exit {codes.get('cloud')}, complete={result.get('complete')}, "
                f"{len(records)}/{target} rounds"))
    others = {n: c for n, c in codes.items() if n != "cloud"}
    out.append(("every edge and client stops by itself", all(c == 0 for c in others.values()),
                ", ".join(f"{n} {c}" for n, c in sorted(others.items()))))
    out.append(("no role exited unless killed", not nem.died,
                ", ".join(f"{n} exited {c}" for n, c in nem.died.items()) or "none"))
    problems = version_problems(records)
    out.append(("versions 1..N, each accepted update once", not problems,
                "; ".join(problems) or f"N = {len(records)}"))
    said = told(fed)
    lost = lost_updates(records, said, key="round")
    out.append(("nothing acknowledged is lost", not lost,
                f"{len(said)} acknowledged, lost {lost[:5]}" if lost
                else f"{len(said)} acknowledged, all in the history"))
    try:
        state, models = CheckpointStore(fed.out / "checkpoint").load()
        version = int(state["strategy"]["version"])
        final = decode_arrays((fed.out / "final_model.safetensors").read_bytes())
        same = version == len(records) and same_model(final, decode_arrays(models[version]))
        detail = f"checkpoint version {version}"
    except (OSError, ValueError, KeyError) as err:
        same, detail = False, f"{type(err).__name__}: {err}"
    out.append(("final model = last checkpoint", same, detail))
    if nem.hostile:
        out.extend(hostile_checks(result))
    return out


def hostile_checks(result: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """``--hostile``: the liar's forged count was registered (and so capped, not refused), and
    the shifter was dropped from every task of its coalition, which went on."""
    clients = {c["name"]: c for c in result.get("clients", [])}
    liar, shifter = clients.get(f"client-{LIAR}", {}), clients.get(f"client-{SHIFTER}", {})
    samples = int(liar.get("samples", 0))
    out = [("the liar's forged count is registered", samples >= 1000 and samples % 1000 == 0,
            f"client-{LIAR} registered {samples} samples")]
    own = [r for r in result.get("records", []) if r.get("coalition") == shifter.get("edge")]
    kept = [r["task_id"] for r in own if shifter.get("id") not in (r.get("dropped") or [])]
    out.append(("the shifted client is dropped, its edge goes on", bool(own) and not kept,
                f"{len(own)} tasks of coalition {shifter.get('edge')}"
                + (f"; client-{SHIFTER} aggregated in {kept[:5]}" if kept else
                   f", client-{SHIFTER} dropped from each")))
    return out


def summary(fed: Any) -> str:
    from collections import Counter

    try:
        result = json.loads((fed.out / "result.json").read_text())
    except (OSError, ValueError):
        return "no result.json"
    recs = result.get("records", [])
    kinds = Counter(f["kind"] for f in result.get("faults", []))
    return (f"{len(recs)} aggregations ({sum(bool(r.get('late')) for r in recs)} late, "
            f"{sum(bool(r.get('dropped')) for r in recs)} with a client dropped); "
            f"cloud faults {dict(sorted(kinds.items()))}")


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=120.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=1, help="draws the schedule (replayable)")
    p.add_argument("--every", type=float, default=8.0, help="mean seconds between faults")
    p.add_argument("--out", type=Path, default=None, help="run folder (default: a temp dir)")
    p.add_argument("--dry-run", action="store_true", help="print the schedule and stop")
    p.add_argument("--hostile", action="store_true", help=f"client-{LIAR} forges its count, "
                   f"client-{SHIFTER} shifts its updates (bench/hostile/sitecustomize.py)")
    args = p.parse_args(argv)
    # a SIGTERM (a test stopping it, `timeout`) takes the same way out as Ctrl-C, through the
    # federation's clean-up: no role, namespace or cgroup is left behind
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    if not args.seconds > 0 or not args.every > 0:
        print("nemesis: --seconds and --every must be > 0", file=sys.stderr)
        return 2
    faults = schedule(args.seed, args.seconds, every_s=args.every)
    say(f"seed {args.seed}, {args.seconds:.0f} s, {len(faults)} faults:")
    for f in faults:
        print(f"  {f.describe()}", flush=True)
    if args.dry_run:
        return 0
    from fedcure_app.testbed.netns import kernel_problem

    problem = kernel_problem()
    if problem:
        print(f"nemesis: {problem}", file=sys.stderr)
        return 2
    from tests.testbed.federation import Federation

    if args.hostile:  # every role it starts imports the hook; it acts in two clients only
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "bench" / "hostile"), *filter(None, [os.environ.get("PYTHONPATH")])])
        os.environ.update(NEMESIS_LIAR=str(LIAR), NEMESIS_SHIFT=str(SHIFTER))
    out = args.out or Path(tempfile.mkdtemp(prefix="nemesis-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "nemesis.toml").write_text(CONFIG)
    fed = Federation(out / "run", [
        "--edges", str(EDGES), "--clients", str(CLIENTS), "--rounds", "100000",
        "--dataset", "digits", "--partition", "iid", "--formation", "none",
        "--tau-e", "2", "--tau-c", "5", "--lr", "0.05", "--eval-every", "100000",
        "--max-concurrent", str(EDGES), "--edge-timeout", str(EDGE_TIMEOUT),
        "--deadline-min", str(DEADLINE_MIN), "--config", str(out / "nemesis.toml"),
        "--cpufreq", "off", "--register-timeout", "300", "--no-progress"], base="nemesis")
    t0 = time.monotonic()
    try:
        fed.start()
        fed.wait("every coalition's first aggregation",
                 lambda: {a.coalition for a in fed.arrivals()} == set(range(EDGES)), PATIENCE)
        say(f"federation up in {out / 'run'}; faults begin", t0)
        nem = Nemesis(fed)
        nem.hostile = args.hostile
        nem.run(faults, args.seconds)
        seen = len(fed.arrivals())
        for m in range(EDGES):
            fed.wait_arrival(f"coalition {m} after the faults", seen, PATIENCE,
                             lambda a, m=m: a.coalition == m)
        say(f"faults over, every coalition aggregated again: {fed.progress()}", t0)
        target = finish(nem, t0)
        results = checks(nem, target)
    except AssertionError as err:  # a wait ran out or a role died before the faults
        say(f"the run did not complete: {err}", t0)
        results = [("the run completes", False, str(err).splitlines()[0])]
    finally:
        fed.close()
    say(summary(fed))
    for name, ok, detail in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    failed = [n for n, ok, _ in results if not ok]
    say("every invariant holds" if not failed else f"{len(failed)} invariant(s) failed; run "
        f"folder {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
