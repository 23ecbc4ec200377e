"""Soak benchmark (issue "Reliability and security"): a cloud and fake edges under injected faults.

On 127.0.0.1 only, for ``--seconds``: the cloud (``fedcure-cloud --resume``, its own process)
trains with ``--edges`` fake edge processes (``tests/deployment/edge_proc.py``) that answer every
task with a deterministic edge model, inject bad models every few tasks (NaN, wrong shape, norm
far outside) and re-send every accepted answer (duplicates). Meanwhile this script kills edges
with SIGKILL (restarting them after a pause) and kills and restarts the cloud with SIGKILL
(:func:`cloud_kill_times`: about every ``--cloud-restart-every`` seconds, at least twice mid-run
in any soak of 30 s or more; the soak's clock stands still while the cloud restarts). At the end
it stops the cloud with SIGTERM (partial results) and prints:

- updates accepted (rounds aggregated) and rejected (bad models refused, by kind), duplicates;
- faults injected (edge kills, client kills, cloud restarts) and survived;
- checks: versions 1..N with one aggregation per task, every update an edge was told was
  accepted is in the history at that version, no bad model accepted, duplicates answered alike,
  and the final model equals a replay of the accepted updates from the initial model.

Client kills are not injected here: fake edges have no clients (the edge role's own soak covers
client drop-outs). Exit status 0 when every check passes.

    python3 bench/soak.py [--seconds 60] [--edges 3] [--clients 6] [--edge-kill-every 6]
                          [--cloud-restart-every 15] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.deployment.reliability import FAST, Proc, one_hot, register_all  # noqa: E402


#: a cloud kill falls at least this long after the start and before the end (seconds), and two
#: kills are at least this far apart, so that the cloud can resume and aggregate in between
KILL_MARGIN_S = 5.0


def cloud_kill_times(seconds: float, every: float, rng: random.Random) -> list[float]:
    """When to SIGKILL the cloud, in seconds after the soak's start (sorted).

    About one kill per ``every`` seconds, and at least two in any soak of 30 s or more: the
    run is cut into n = max(2, ⌊seconds/every⌋) equal slots (n = 1 below 30 s) and each kill
    falls at a random point in the middle half of its slot, inside
    [KILL_MARGIN_S, seconds − KILL_MARGIN_S] and at least KILL_MARGIN_S after the previous one
    (slots too short for that are dropped, never below two kills when seconds ≥ 30).
    """
    if seconds < 2 * KILL_MARGIN_S:
        return []
    usable = seconds - 2 * KILL_MARGIN_S
    n = max(2 if seconds >= 30 else 1, int(seconds // max(every, 1e-9)))
    n = min(n, max(2 if seconds >= 30 else 1, int(usable // KILL_MARGIN_S) + 1))
    slot = usable / n
    times: list[float] = []
    for i in range(n):
        lo = KILL_MARGIN_S + slot * (i + 0.25)
        hi = KILL_MARGIN_S + slot * (i + 0.75)
        t = rng.uniform(lo, hi) if hi > lo else lo
        if times and t - times[-1] < KILL_MARGIN_S:
            t = times[-1] + KILL_MARGIN_S
        if t > seconds - KILL_MARGIN_S:
            break
        times.append(t)
    return times


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="soak duration (default 60)")
    p.add_argument("--edges", type=int, default=3)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--edge-kill-every", type=float, default=6.0, metavar="S",
                   help="mean seconds between edge kills (default 6)")
    p.add_argument("--cloud-restart-every", type=float, default=15.0, metavar="S",
                   help="about one cloud kill per S seconds, at least two in a soak of 30 s "
                        "or more (default 15)")
    p.add_argument("--task-seconds", type=float, default=0.1, help="fake edge delay per task")
    p.add_argument("--settle", type=float, default=60.0,
                   help="at most this long after --seconds for revived edges to rejoin")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output folder (default: a temporary one)")
    return p.parse_args()


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.out = Path(args.out or tempfile.mkdtemp(prefix="fedcure-soak-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config = self.out / "soak.toml"
        self.config.write_text(
            "[run]\nglobal-rounds = 1000000\n"
            "[reliability]\ndeadline-min-s = 2.0\ndeadline-slack = 2.0\n"
            "first-deadline-s = 2.0\n")
        self.clouds: list[Proc] = []
        self.edges: dict[int, list[Proc]] = {m: [] for m in range(args.edges)}
        self.edge_kills: list[tuple[int, int]] = []  # (edge, index of the killed process)
        self.cloud_kills = 0

    # -------------------------------------------------------------- processes
    def start_cloud(self) -> Proc:
        p = Proc("-m", "cloud_server.cli", "--listen", self.address,
                 "--expected-clients", str(self.args.clients), "--edges", str(self.args.edges),
                 "--formation", "none", "--out", str(self.out), "--config", str(self.config),
                 "--no-plots", "--insecure", "--resume", "--register-timeout", "120")
        self.clouds.append(p)
        p.wait_for(r"listening on", timeout=120)
        return p

    def start_edge(self, m: int) -> Proc:
        p = Proc("-m", "tests.deployment.edge_proc", "--cloud", self.address, "--edge-id", str(m),
                 "--delay", str(self.args.task_seconds * (0.5 + m / max(1, self.args.edges))),
                 "--insecure", "--bad-every", "5", "--duplicates",
                 "--lifetime", str(self.args.seconds + 300))
        self.edges[m].append(p)
        return p

    def register(self) -> None:
        from cloud_server.service import CloudService  # noqa: F401 - warm imports
        from fedcure_app.config import FedCureConfig
        from fedcure_app.protocol import cloud_pb2 as pb
        from fedcure_app.protocol.codec import profile_to_proto

        cfg = FedCureConfig()
        samples = cfg.method.tau_c * cfg.method.batch_size
        # prior latency ≈ the fake edges' delay: τ_e edge rounds of `samples` at f_max = 4 GHz
        cps = self.args.task_seconds / cfg.method.tau_e * FAST.f_max_ghz * 1e9 / samples
        prof = FAST.model_copy(update={"cycles_per_sample": {"digits": cps}})
        reqs = []
        for i in range(self.args.clients):
            req = pb.RegisterRequest(client_name=f"c{i}", label_counts=one_hot(i, classes=10),
                                     device=profile_to_proto(prof))
            req.home_edge = i % self.args.edges
            reqs.append(req)
        register_all(self.address, reqs, timeout=120)

    # -------------------------------------------------------------- the soak
    def run(self) -> int:
        t0 = time.monotonic()
        cloud = self.start_cloud()
        for m in range(self.args.edges):
            self.start_edge(m)
        self.register()
        print(f"soak: cloud on {self.address}, {self.args.edges} edges, "
              f"{self.args.clients} clients; running {self.args.seconds:.0f} s "
              f"(setup {time.monotonic() - t0:.1f} s)", flush=True)
        begin = time.monotonic()
        end = begin + self.args.seconds
        next_edge = time.monotonic() + self.rng.expovariate(1 / self.args.edge_kill_every)
        kills = [begin + t for t in cloud_kill_times(self.args.seconds,
                                                     self.args.cloud_restart_every, self.rng)]
        print(f"soak: cloud kills planned at {[round(k - begin, 1) for k in kills]} s",
              flush=True)
        revive: list[tuple[float, int]] = []
        try:
            while time.monotonic() < end:
                now = time.monotonic()
                for at, m in list(revive):
                    if now >= at:
                        revive.remove((at, m))
                        self.start_edge(m)
                if now >= next_edge:
                    # kill only edges that are up and working (their process got a task)
                    alive = [m for m in self.edges if all(m != r[1] for r in revive)
                             and "task " in "".join(self.edges[m][-1].log)]
                    if len(alive) > 1:  # keep one edge alive at least
                        m = self.rng.choice(alive)
                        self.edges[m][-1].kill()
                        self.edge_kills.append((m, len(self.edges[m]) - 1))
                        revive.append((now + self.rng.uniform(1.0, 4.0), m))
                    next_edge = now + self.rng.expovariate(1 / self.args.edge_kill_every)
                if kills and now >= kills[0]:
                    kills.pop(0)
                    cloud.kill()
                    self.cloud_kills += 1
                    cloud = self.start_cloud()
                    # the soak's clock stands still while the cloud restarts (seconds on a
                    # loaded machine): every planned kill still falls mid-run
                    pause = time.monotonic() - now
                    end += pause
                    kills = [k + pause for k in kills]
                    next_edge += pause
                time.sleep(0.05)
            for _, m in revive:
                self.start_edge(m)
            # let every revived edge rejoin and have an update accepted (bounded wait)
            settle = time.monotonic() + self.args.settle
            while time.monotonic() < settle and not all(
                    re.search(r"^reply \S+ accepted=1", "".join(ps[-1].log), flags=re.M)
                    for ps in self.edges.values()):
                time.sleep(0.2)
            cloud.proc.terminate()  # SIGTERM: partial results and the final model
            rc = cloud.proc.wait(60)
        finally:
            for p in self.clouds + [p for ps in self.edges.values() for p in ps]:
                p.kill()
            logs = self.out / "logs"
            logs.mkdir(exist_ok=True)
            for i, p in enumerate(self.clouds):
                (logs / f"cloud-{i}.log").write_text("".join(p.log))
            for m, ps in self.edges.items():
                for i, p in enumerate(ps):
                    (logs / f"edge{m}-{i}.log").write_text("".join(p.log))
        return self.report(rc, time.monotonic() - t0)

    # -------------------------------------------------------------- checks
    def report(self, rc: int, wall: float) -> int:
        from cloud_server.controller import initial_model
        from fedcure_app.config import FedCureConfig, apply_flat
        from fedcure_app.protocol.codec import decode_arrays
        from tests.deployment.edge_proc import edge_model
        from tests.deployment.invariants import lost_updates, replay, same_model, version_problems

        result = json.loads((self.out / "result.json").read_text())
        records = result["records"]
        edge_logs = {m: ["".join(p.log) for p in ps] for m, ps in self.edges.items()}
        all_logs = "".join(t for logs in edge_logs.values() for t in logs)
        told = re.findall(r"^reply (\S+) accepted=1 version=(\d+)$", all_logs, flags=re.M)
        rejected: dict[str, int] = {}
        for kind, code in re.findall(r"^rejected \S+ (\S+) (\S+)$", all_logs, flags=re.M):
            rejected[f"{kind}:{code}"] = rejected.get(f"{kind}:{code}", 0) + 1
        lost = lost_updates(records, told)
        # an edge kill is survived when the restarted edge had an update accepted afterwards
        survived_edges = sum(
            1 for m, i in self.edge_kills
            if any(re.search(r"^reply \S+ accepted=1", t, flags=re.M)
                   for t in edge_logs[m][i + 1:])
        )
        resumed = [f for f in result["faults"] if f["kind"] == "resumed"]
        survived_clouds = sum(
            1 for f in resumed if any(r["round"] > f["round"] for r in records))
        cfg = apply_flat(FedCureConfig(), {"num-edges": self.args.edges,
                                           "num-clients": self.args.clients,
                                           "formation": "none"})
        glob = replay(initial_model(cfg), records, edge_model)
        final = decode_arrays((self.out / "final_model.safetensors").read_bytes())
        checks = {
            "cloud exited 0 on SIGTERM": rc == 0,
            "versions 1..N, one aggregation per task": not version_problems(records),
            "no accepted update lost": not lost,
            "no bad model accepted": "BAD-ACCEPTED" not in all_logs,
            "duplicates answered alike": "duplicate" in all_logs
                and "DIFFERENT" not in all_logs,
            "every cloud restart resumed": len(resumed) == self.cloud_kills,
            "final model == replay of accepted updates": same_model(final, glob),
        }
        ck = result.get("checkpoints") or {}
        print(f"soak: {wall:.1f} s wall, {len(records)} updates accepted "
              f"(final version {result['final_version']}), "
              f"{sum(rejected.values())} bad models rejected {dict(sorted(rejected.items()))}, "
              f"{all_logs.count('duplicate ')} duplicates re-sent")
        print(f"faults injected: {len(self.edge_kills)} edge kills (SIGKILL), 0 client kills "
              f"(fake edges have no clients), {self.cloud_kills} cloud restarts (SIGKILL)")
        print(f"faults survived: {survived_edges}/{len(self.edge_kills)} edge kills, "
              f"{survived_clouds}/{self.cloud_kills} cloud restarts; cloud saw "
              f"{sum(f['kind'] == 'lost' for f in result['faults'])} coalitions lost and "
              f"{sum(f['kind'] == 'back' for f in result['faults'])} taken back")
        if ck:
            print(f"checkpoints (last cloud process): {ck.get('writes')} writes, "
                  f"{1000 * ck.get('seconds', 0) / max(1, ck.get('writes', 1)):.1f} ms each")
        for name, ok in checks.items():
            print(f"  [{'ok' if ok else 'FAIL'}] {name}")
        if lost:
            print(f"  lost: {lost[:5]}")
        print(f"output: {self.out}")
        return 0 if all(checks.values()) else 1


def main() -> int:
    return Soak(parse()).run()


if __name__ == "__main__":
    sys.exit(main())
