"""The wall time of one Table 1 run alone, simulated into the experiment's run cache.

    python3 bench/one_run.py --dataset cifar10 --data-dir DIR --out docs/results/paper \
        --reading momentum --executor batched --device cuda [--method fedcure] [--seed 0]

It simulates the Table 1 run of ``--method`` and ``--seed`` at the paper's budget exactly as
``fedcure experiment table1`` would (same configuration, same cache key, stored in
``OUT/<dataset>/runs/``, so the experiment later takes it from the cache), in this process with
one torch thread and nothing else of ours running, and prints its wall time and final accuracy.
A run already in the cache is reported as such, not simulated again.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from fedcure_app.data import load_dataset
from fedcure_app.experiments import table1
from fedcure_app.experiments.base import Context
from fedcure_app.experiments.budget import get_budget
from fedcure_app.experiments.readings import READINGS, get_reading
from fedcure_app.experiments.runner import Runner
from fedcure_app.training import configure_threads, resolve_device


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", default="docs/results/paper")
    p.add_argument("--reading", default="momentum", choices=list(READINGS))
    p.add_argument("--executor", default="batched", choices=["inprocess", "batched"])
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda", "auto"])
    p.add_argument("--method", default="fedcure", choices=list(table1.METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="the batched executor without CUDA graphs (same cache key)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    configure_threads(1)
    device = resolve_device(args.device)
    dataset = load_dataset(args.dataset, args.data_dir)
    budget = get_budget("paper", dataset.name, max(3, args.seed + 1), 1)
    runner = Runner(dataset, Path(args.out) / dataset.name / "runs", workers=1, device=device)
    ctx = Context(dataset=dataset, data_dir=args.data_dir, budget=budget,
                  out_dir=Path(args.out) / dataset.name, runner=runner,
                  reading=get_reading(args.reading),
                  extra={"executor": args.executor,
                         **({} if args.cuda_graphs else {"cuda-graphs": False})})
    spec = next((s for s in table1.specs(ctx, args.method) if s.cfg.run.seed == args.seed), None)
    if spec is None:
        print(f"no Table 1 run of {args.method} with seed {args.seed}", file=sys.stderr)
        return 2
    cached = runner.peek(spec) is not None
    t0 = time.perf_counter()
    result = runner.run_one(spec)
    wall = time.perf_counter() - t0
    gpu = f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""
    print(f"{spec.label}, reading {args.reading}, executor {args.executor}, device "
          f"{device}{gpu}: " + ("in the cache already (simulated in "
                                f"{result.get('wall_seconds', 0):.1f} s)" if cached else
                                f"{wall:.1f} s alone")
          + f", final accuracy {100 * result['final_accuracy']:.2f} %; load average before "
          f"{os.getloadavg()[0]:.2f}; {platform.processor() or platform.machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
