"""The batched executor against the one-by-one executor: client steps per second, and whole runs.

``steps``: one coalition task (``--clients`` clients, batch 32, τ_c = 5, ``--tau-e`` edge rounds)
of the MNIST and the CIFAR CNN on synthetic inputs of the right shape, trained by
:class:`InProcessExecutor` and by :class:`BatchedExecutor` from the same weights, alternating,
best of ``--repeats``; prints client steps per second (wall and CPU time) and the largest
difference of the two edge models. On a GPU also each of the batched executor's convolution
paths on its own (``batched`` itself times them on its first edge round and keeps the fastest),
the path without CUDA graphs and vmap's gradient; ``--paths`` times the paths on the CPU too.

``run``: the same ``fedcure simulate`` run (real data) with ``--executor inprocess`` and
``--executor batched``, one worker, one torch thread; prints the wall time and final accuracy
of each and the speed-up. Exits 1 when the accuracies differ by more than ``--max-diff`` points.

    python3 bench/batched.py steps [--device cpu|cuda] [--repeats 3] [--paths]
    python3 bench/batched.py run --dataset mnist --data-dir DIR --rounds 6 [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time

import numpy as np
import torch

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.models import INPUT_SHAPES, build_model, get_weights
from fedcure_app.simulation.batched import BatchedExecutor
from fedcure_app.simulation.conv_tuning import CONV_PATHS
from fedcure_app.simulation.executors import InProcessExecutor
from fedcure_app.tasks import EdgeTask
from fedcure_app.training import configure_threads, resolve_device

log = logging.getLogger("bench.batched")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, device: torch.device) -> tuple[float, float]:
    """(wall s, CPU s of this process) of ``fn()``."""
    _sync(device)
    w, c = time.perf_counter(), time.process_time()
    fn()
    _sync(device)
    return time.perf_counter() - w, time.process_time() - c


def steps(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    rows = []
    for dataset in args.models.split(","):
        rng = np.random.default_rng(0)
        shape = INPUT_SHAPES[dataset]
        sizes = [1200] * args.clients
        data = [(torch.from_numpy(rng.standard_normal((n, *shape), dtype=np.float32)),
                 torch.from_numpy(rng.integers(0, 10, n))) for n in sizes]
        torch.manual_seed(0)
        task = EdgeTask("bench", 0, 0, get_weights(build_model(dataset)),
                        tuple(range(args.clients)), {}, args.tau_e, 5, 0.01, 32, 1,
                        momentum=0.9)
        executors = {"inprocess": InProcessExecutor(dataset, 10, data, device=device),
                     "batched": BatchedExecutor(dataset, 10, data, device=device)}
        if device.type == "cuda" or args.paths:  # each convolution path on its own
            for path in CONV_PATHS:
                executors[f"batched, {path}"] = BatchedExecutor(
                    dataset, 10, data, device=device, vectorized=True, conv_path=path)
        if device.type == "cuda":  # the GPU path without graphs, and vmap's gradient
            executors["batched, no CUDA graph"] = BatchedExecutor(dataset, 10, data,
                                                                  device=device, graphs=False)
            vm = BatchedExecutor(dataset, 10, data, device=device, graphs=False)
            vm._grouped = None
            executors["batched, vmap"] = vm
        results = {k: ex.run(task) for k, ex in executors.items()}  # warm-up (and results)
        tuned = executors["batched"].conv_choice
        if tuned is not None:
            print(f"{dataset}: the batched executor chose {tuned.describe()} per edge round",
                  flush=True)
        diffs = {k: max(float(np.abs(a - b).max()) for a, b in
                        zip(results["inprocess"].arrays, r.arrays))
                 for k, r in results.items() if k != "inprocess"}
        diff = max(diffs.values())
        best = {k: (float("inf"), float("inf")) for k in executors}
        for _ in range(args.repeats):
            for k, ex in executors.items():
                wall, cpu = _time(lambda ex=ex: ex.run(task), device)
                best[k] = (min(best[k][0], wall), min(best[k][1], cpu))
        n_steps = args.clients * args.tau_e * 5
        for k in executors:
            rows.append((dataset, k, n_steps / best[k][0], n_steps / best[k][1],
                         diffs.get(k)))
        print(f"{dataset}: batched {best['inprocess'][0] / best['batched'][0]:.2f}x the "
              f"one-by-one steps/s (wall), edge models differ by at most {diff:.1e}",
              flush=True)
    print()
    print(f"device {device}{' (' + torch.cuda.get_device_name() + ')' if device.type == 'cuda' else ''}, "
          f"{torch.get_num_threads()} torch thread(s), {args.clients} clients, batch 32, "
          f"τ_c 5, τ_e {args.tau_e}, momentum 0.9, best of {args.repeats}; load average before: "
          f"{os.getloadavg()[0]:.2f}; {platform.processor() or platform.machine()}")
    print("| model | executor | client steps/s (wall) | client steps/s (CPU time) "
          "| edge model vs one-by-one (max abs) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for dataset, k, wall, cpu, d in rows:
        print(f"| {dataset} | {k} | {wall:.0f} | {cpu:.0f} | "
              f"{'—' if d is None else f'{d:.1e}'} |")
    return 0


def run(args: argparse.Namespace) -> int:
    from fedcure_app.data import load_dataset
    from fedcure_app.simulation.engine import simulate

    device = resolve_device(args.device)
    ds = load_dataset(args.dataset, args.data_dir)
    base = apply_flat(FedCureConfig(), {"dataset": args.dataset, "global-rounds": args.rounds,
                                        "seed": args.seed, "method": "fedcure",
                                        "eval-every": args.rounds})
    order = ["inprocess", "batched"] if not args.batched_first else ["batched", "inprocess"]
    load = os.getloadavg()[0]
    ratios, accuracy = [], {}
    for rep in range(args.repeats):
        seconds = {}
        for name in order if rep % 2 == 0 else order[::-1]:  # alternate who goes first
            cfg = apply_flat(base, {"executor": name})
            t0 = time.perf_counter()
            result = simulate(cfg, dataset=ds, workers=1, device=device)
            seconds[name] = time.perf_counter() - t0
            accuracy[name] = result["final_accuracy"]
            print(f"{name}: {seconds[name]:.1f} s, final accuracy {100 * accuracy[name]:.2f} %",
                  flush=True)
        ratios.append(seconds["inprocess"] / seconds["batched"])
        print(f"repeat {rep + 1}: batched is {ratios[-1]:.2f}x faster", flush=True)
    diff = 100 * abs(accuracy["inprocess"] - accuracy["batched"])
    print(f"\n{args.dataset}, {args.rounds} rounds, seed {args.seed}, device {device}, one "
          f"worker, {torch.get_num_threads()} torch thread(s); load average before "
          f"{load:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"batched is {float(np.median(ratios)):.2f}x faster (median of {len(ratios)}: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}); final accuracies differ by {diff:.2f} "
          "points")
    return 0 if diff <= args.max_diff else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("steps", help="client steps per second, both executors")
    s.add_argument("--clients", type=int, default=10)
    s.add_argument("--tau-e", type=int, default=2)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--models", default="mnist,cifar10",
                   help="comma-separated models (datasets) to time")
    s.add_argument("--paths", action="store_true",
                   help="on the CPU too: time each convolution path of the vectorized step "
                   "(grouped, grouped-nhwc, im2col), which the CPU's default does not use")
    r = sub.add_parser("run", help="one fedcure simulate run with each executor")
    r.add_argument("--dataset", default="mnist")
    r.add_argument("--data-dir")
    r.add_argument("--rounds", type=int, default=6)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--max-diff", type=float, default=1.0,
                   help="largest accepted final-accuracy difference (points)")
    r.add_argument("--batched-first", action="store_true", help="run the batched one first")
    r.add_argument("--repeats", type=int, default=1,
                   help="pairs of runs, alternating which executor goes first; the speed-up "
                   "printed is their median")
    for q in (s, r):
        q.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
        q.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    configure_threads(args.threads)
    return steps(args) if args.what == "steps" else run(args)


if __name__ == "__main__":
    sys.exit(main())
