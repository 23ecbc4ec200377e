"""Benchmark: one scheduling decision plus the estimator update at M = 1,000 coalitions.

Each timed step is what the cloud does per global round: read T̂ (the estimator's posterior
predictive means), pick a coalition among the available ones (``Scheduler.select``), close the
round (``Scheduler.end_round``, every queue updated once) and record the arrived coalition's
measured latency (``LatencyEstimator.update``). Availability (about half the coalitions) and
latencies are drawn outside the timed region. Goal: ≤ 1 ms per decision (mean and p99 printed).

    python3 bench/scheduling.py [--coalitions 1000] [--decisions 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedcure_app.core.estimator import LatencyEstimator
from fedcure_app.core.scheduler import SCHEDULERS, make_scheduler, queue_deltas


def run(name: str, m: int, decisions: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(100, 2000, size=m)
    prior = rng.uniform(5.0, 60.0, size=m)
    sched = make_scheduler(name, queue_deltas(sizes, 0.9), beta=0.5, seed=seed)
    est = LatencyEstimator(prior)
    avail_draws = rng.random((decisions, m)) < 0.5
    jitter = rng.lognormal(0.0, 0.2, size=decisions)
    times = np.empty(decisions)
    for i in range(decisions):
        available = np.flatnonzero(avail_draws[i]).tolist() or [0]
        t0 = time.perf_counter_ns()
        t_hat = est.mean()
        pick = sched.select(available, t_hat)
        sched.end_round([pick])
        est.update(pick, float(prior[pick] * jitter[i]))
        times[i] = time.perf_counter_ns() - t0
    return times / 1e6  # ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coalitions", type=int, default=1000)
    p.add_argument("--decisions", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"scheduling decision + estimator update, M = {args.coalitions}, "
          f"{args.decisions} decisions (goal: <= 1 ms)")
    for name in SCHEDULERS:
        ms = run(name, args.coalitions, args.decisions, args.seed)
        print(f"  {name:8s} mean {ms.mean():.3f} ms   p50 {np.percentile(ms, 50):.3f} ms   "
              f"p99 {np.percentile(ms, 99):.3f} ms   max {ms.max():.3f} ms")


if __name__ == "__main__":
    main()
