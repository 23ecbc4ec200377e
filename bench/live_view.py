"""CPU cost of the live view's reads and of the snapshot the cloud publishes, in-process.

For a run of ``--rounds`` global rounds, M = ``--edges`` coalitions and N = ``--clients``
clients it times (CPU seconds of this process, best of ``--repeat``):

- ``StrategyView.of``: what the cloud adds under its lock after every transition (the history
  extended by one round);
- ``to_json`` + ``json.dumps`` of a whole snapshot (an event stream's first event) and of one
  with only the newest round (every later event);
- ``exposition``: one Prometheus scrape of ``/metrics``.

    python3 bench/live_view.py [--rounds 100,1000] [--edges 5] [--clients 50] [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import numpy as np

from fedcure_app.live.metrics import exposition
from fedcure_app.live.model import Counts, LiveState, Progress, StrategyView
from fedcure_app.strategy import Dispatch


def fake_run(rounds: int, m: int, n: int, seed: int = 0):
    """A strategy-like object and ``rounds`` records shaped like the cloud's."""
    rng = np.random.default_rng(seed)
    members = [tuple(range(i, n, m)) for i in range(m)]
    records = []
    for r in range(1, rounds + 1):
        c = int(rng.integers(m))
        freqs = {str(x): float(rng.uniform(0.6, 1.8)) for x in members[c]}
        records.append({"round": r, "time_s": 3.0 * r, "coalition": c, "version": r,
                        "staleness": int(rng.integers(3)), "xi": 0.19, "latency_s": 3.0,
                        "estimate_s": 3.1, "queues": rng.uniform(0, 2, m).tolist(),
                        "accuracy": 0.9 if r % 5 == 0 else None, "late": False,
                        "dropped": [], "frequencies_ghz": freqs, "applied_ghz": freqs})
    d = Dispatch(round=rounds, coalition=0, version=rounds, clients=members[0],
                 frequencies_ghz={x: 1.0 for x in members[0]}, t_hat_round_s=0.5, t_hat_s=3.0)
    strategy = SimpleNamespace(
        version=rounds, round=rounds, max_concurrent=max(1, m // 2), coalitions=members,
        delta=np.full(m, 1.0 / m), scheduler=SimpleNamespace(queues=SimpleNamespace(
            values=rng.uniform(0, 2, m))), estimator=SimpleNamespace(
            mean=lambda: np.full(m, 3.0)), in_flight={0: d}, unavailable=set())
    return strategy, records


def best(fn, repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        out = min(out, time.process_time() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", default="100,1000")
    p.add_argument("--edges", type=int, default=5)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args(argv)
    print(f"M = {args.edges} coalitions, N = {args.clients} clients; CPU ms, best of "
          f"{args.repeat}")
    head = (f"{'rounds':>6s} {'publish':>8s} {'first event':>11s} {'next event':>10s} "
            f"{'scrape':>7s} {'first KiB':>9s} {'scrape KiB':>10s}")
    print(head)
    print("-" * len(head))
    for rounds in (int(x) for x in args.rounds.split(",")):
        strategy, records = fake_run(rounds, args.edges, args.clients)
        prev = StrategyView.of(strategy, records[:-1], 4)
        view = StrategyView.of(strategy, records, 4, prev)
        state = LiveState(phase="training", global_rounds=rounds * 2, view=view,
                          clients_registered=args.clients, expected_clients=args.clients,
                          edges_connected=args.edges, num_edges=args.edges,
                          progress=(Progress(0, 1, 4, (0, 5), 1.0, 2.0),),
                          counts=Counts(accepted=rounds))
        publish = best(lambda: StrategyView.of(strategy, records, 4, prev), args.repeat)
        first = best(lambda: json.dumps(state.to_json(0)), args.repeat)
        nxt = best(lambda: json.dumps(state.to_json(rounds - 1)), args.repeat)
        scrape = best(lambda: exposition(lambda: state), args.repeat)
        print(f"{rounds:6d} {1e3 * publish:8.3f} {1e3 * first:11.3f} {1e3 * nxt:10.3f} "
              f"{1e3 * scrape:7.3f} {len(json.dumps(state.to_json(0))) / 1024:9.1f} "
              f"{len(exposition(lambda: state)) / 1024:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
