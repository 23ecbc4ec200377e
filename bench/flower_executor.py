"""Benchmark: wall seconds per edge round, Flower path vs in-process executor.

Runs the same configuration twice: the engine with the in-process executor, and the Flower App
(ServerApp + ClientApps on virtual SuperNodes on Ray, through
:func:`fedcure_app.flower.run.run_flower_simulation`). Prints, per path, the wall
seconds per edge round (every client of the coalition trains τ_c steps, then FedAvg) and the
Flower path's overhead per edge round; the Flower figure is also given without the first task,
whose messages start the ClientApp actors. The schedule traces must be identical.

    python3 bench/flower_executor.py [--clients 10] [--edges 3] [--rounds 10] [--tau-c 2]
        [--tau-e 2] [--dataset digits] [--data-dir DIR] [--partition edge-noniid]
        [--client-cpus 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

from fedcure_app.flower.app_config import config_from_run_config  # noqa: E402
from fedcure_app.simulation.engine import (  # noqa: E402
    SimulationEngine,
    build_federation,
    make_inprocess_executor,
)
from fedcure_app.flower.run import full_run_config, run_flower_simulation  # noqa: E402


class TimedExecutor:
    """Wraps an executor and records wall seconds per edge round."""

    def __init__(self, inner) -> None:
        self.inner, self.per_task = inner, []

    def run(self, task):
        t0 = time.perf_counter()
        out = self.inner.run(task)
        self.per_task.append((task.tau_e, time.perf_counter() - t0))
        return out

    def close(self) -> None:
        self.inner.close()


def per_round(per_task: list[tuple[int, float]]) -> float:
    """Mean wall seconds per edge round over the given (edge rounds, seconds) tasks."""
    rounds = sum(r for r, _ in per_task)
    return sum(s for _, s in per_task) / rounds if rounds else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--edges", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tau-c", type=int, default=2)
    ap.add_argument("--tau-e", type=int, default=2)
    ap.add_argument("--partition", default="edge-noniid")
    ap.add_argument("--client-cpus", type=float, default=1.0)
    a = ap.parse_args()
    over = {"dataset": a.dataset, "data-dir": a.data_dir, "num-clients": a.clients,
            "num-edges": a.edges, "global-rounds": a.rounds, "tau-c": a.tau_c,
            "tau-e": a.tau_e, "eval-every": a.rounds, "lr": 0.05, "partition": a.partition}
    cfg = config_from_run_config(full_run_config(over))

    fed = build_federation(cfg)
    ex = TimedExecutor(make_inprocess_executor(fed))
    ref = SimulationEngine(fed, ex).run()
    inproc_all = per_round(ex.per_task)
    inproc = per_round(ex.per_task[a.edges:])

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        res = run_flower_simulation({**over, "out-dir": out}, client_num_cpus=a.client_cpus)
        total = time.perf_counter() - t0
    fl = res["flower"]
    same = [(r["coalition"], r["time_s"]) for r in res["records"]] == \
        [(r["coalition"], r["time_s"]) for r in ref["records"]]
    print(f"config: {a.dataset}, {a.clients} clients, {a.edges} edges, {a.rounds} global rounds, "
          f"tau_c={a.tau_c}, tau_e={a.tau_e}, {fl['edge_rounds']} edge rounds")
    flower = per_round([tuple(t) for t in fl["per_task"][a.edges:]])
    print(f"in-process : {inproc * 1e3:8.1f} ms per edge round after the first {a.edges} tasks "
          f"({inproc_all * 1e3:.1f} ms over all: torch warm-up)")
    print(f"flower     : {flower * 1e3:8.1f} ms per edge round after the first {a.edges} tasks "
          f"({fl['seconds_per_edge_round'] * 1e3:.1f} ms over all: actor start-up)")
    print(f"overhead   : {(flower - inproc) * 1e3:8.1f} ms per edge round (warm)")
    print(f"flower run : {total:.1f} s wall in all (Ray start, discovery "
          f"{fl['discovery_seconds']:.1f} s)")
    print(f"accuracy   : in-process {ref['final_accuracy']:.4f}, flower "
          f"{res['final_accuracy']:.4f}; same schedule trace: {same}")


if __name__ == "__main__":
    main()
