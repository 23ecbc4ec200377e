"""Benchmark: the simulation engine's in-process executor against a bare PyTorch loop.

Reference workload (issue "The SAFL simulation"): MNIST, 50 clients, 5 ESs, τ_c = 5, τ_e = 12,
batch 32, 20 global rounds, evaluation every 5 rounds. The bare loop performs the same number of
local SGD steps (same model, batch size, learning rate) and the same evaluations, with no
federation around them. Goal: engine time ≤ 1.15 × bare time.

    python3 bench/engine.py [--data-dir ../shared/data/mnist] [--rounds 20]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fedcure_app.config import apply_flat, FedCureConfig
from fedcure_app.data import load_dataset
from fedcure_app.models import build_model
from fedcure_app.simulation.engine import (
    SimulationEngine,
    build_federation,
    make_inprocess_executor,
)
from fedcure_app.training import configure_threads, evaluate

ROOT = Path(__file__).resolve().parents[1]


class CountingExecutor:
    """Wraps an executor and counts the local steps it ran."""

    def __init__(self, inner, tau_c: int) -> None:
        self.inner = inner
        self.steps = 0
        self.tau_c = tau_c

    def run(self, task):
        self.steps += len(task.clients) * task.tau_e * task.tau_c
        return self.inner.run(task)

    def close(self) -> None:
        self.inner.close()


def bare_loop(ds, steps: int, evals: int, lr: float, batch: int, seed: int) -> float:
    """Seconds for ``steps`` plain SGD steps and ``evals`` test-set evaluations."""
    torch.manual_seed(seed)
    model = build_model("mnist", 10)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.from_numpy(ds.x_train)
    y = torch.from_numpy(ds.y_train)
    xt = torch.from_numpy(ds.x_test)
    yt = torch.from_numpy(ds.y_test)
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    model.train()
    n = x.shape[0]
    perm = torch.randperm(n, generator=g)
    pos = 0
    for _ in range(steps):
        if pos + batch > n:
            perm = torch.randperm(n, generator=g)
            pos = 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    for _ in range(evals):
        evaluate(model, xt, yt)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--edges", type=int, default=5)
    args = ap.parse_args()
    configure_threads()
    cfg = apply_flat(FedCureConfig(), {
        "dataset": "mnist", "data-dir": args.data_dir, "num-clients": args.clients,
        "num-edges": args.edges, "tau-c": 5, "tau-e": 12, "batch-size": 32,
        "global-rounds": args.rounds, "eval-every": 5, "method": "fedcure", "seed": 0,
    })
    ds = load_dataset("mnist", args.data_dir)
    fed = build_federation(cfg, ds)
    ex = CountingExecutor(make_inprocess_executor(fed), cfg.method.tau_c)
    engine = SimulationEngine(fed, ex)
    t0 = time.perf_counter()
    result = engine.run()
    t_engine = time.perf_counter() - t0
    evals = 1 + sum(r["accuracy"] is not None for r in result["records"])
    t_bare = bare_loop(ds, ex.steps, evals, cfg.method.lr, cfg.method.batch_size, 0)
    ratio = t_engine / t_bare
    print(f"workload: MNIST, {args.clients} clients, {args.edges} ESs, tau_c=5, tau_e=12, "
          f"batch 32, {args.rounds} global rounds, eval every 5")
    print(f"local steps run: {ex.steps}   evaluations: {evals}")
    print(f"engine (in-process): {t_engine:.2f} s   "
          f"final accuracy {100 * result['final_accuracy']:.2f} %")
    print(f"bare PyTorch loop:   {t_bare:.2f} s")
    print(f"ratio engine/bare:   {ratio:.3f}  (goal <= 1.15: {'PASS' if ratio <= 1.15 else 'FAIL'})")


if __name__ == "__main__":
    main()
