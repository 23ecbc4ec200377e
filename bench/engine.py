"""Benchmark: the simulation engine's local steps per second, by worker count, under load, and
against Flower's stock Simulation Runtime.

Reference workload (issues "The SAFL simulation" and 13): MNIST, 50 clients, 5 ESs, τ_c = 5,
τ_e = 12, batch 32, 20 global rounds, evaluation every 5 rounds. Rows of the one table:

- ``engine, N workers`` for N = 1 … ``--max-workers`` (default: the cores): the same run with
  the sequential executor (N = 1) and the parallel one (the scaling with worker count);
- the same with all cores while a CPU-bound process (``python3 -c "while True: pass"``)
  occupies one core (``--no-hog`` leaves it out);
- ``bare PyTorch loop`` (``--bare``): the same steps and evaluations with no federation;
- ``Flower stock``: the same local steps as flat FedAvg on Flower's Simulation Runtime, the
  anchor a user would otherwise pick: ``bench/flower_stock`` (a plain ClientApp with a textbook
  loop, same model, batch, learning rate and partition, and ``flwr.serverapp.strategy.FedAvg``
  sampling 10 of the 50 clients per round, τ_c·τ_e = 60 local steps each, as many rounds as the
  engine ran coalition tasks), run on virtual SuperNodes with one ClientApp actor per core.
  A second row makes it aggregate as often as the edges do: τ_e times as many rounds of
  τ_c = 5 local steps each (the same steps, the hierarchy's schedule flattened);
  ``--stock-aggregation task|edge-round`` keeps one of the two rows.
  Its time is the ServerApp's ``strategy.start`` alone (Ray start-up excluded, which favours
  Flower); ``--no-flower`` leaves it out.

Goals: ``--workers 2`` ≥ 1.7 × the sequential executor's local steps/s on 2 cores; the engine
with all cores ≥ 3 × Flower stock's steps/s. Every engine row must end with the same model
(the executors are bit-for-bit equal); the bench checks the final accuracies agree.

    python3 bench/engine.py [--data-dir ../shared/data/mnist] [--rounds 20] [--max-workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.models import build_model
from fedcure_app.simulation.engine import SimulationEngine, build_federation, make_executor
from fedcure_app.runtime.threads import apply_thread_policy, available_cores
from fedcure_app.training import evaluate

ROOT = Path(__file__).resolve().parents[1]


class CountingExecutor:
    """Wraps an executor and counts the coalition tasks and local steps it ran."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.steps = 0
        self.tasks = 0

    def _count(self, task) -> None:
        self.steps += len(task.clients) * task.tau_e * task.tau_c
        self.tasks += 1

    def run(self, task):
        self._count(task)
        return self.inner.run(task)

    def submit(self, task):
        """Whole tasks side by side (a parallel executor): counted once they ran; a task still
        queued when the run ended is cancelled and not counted."""
        future = self.inner.submit(task)
        future.add_done_callback(lambda f: None if f.cancelled() else self._count(task))
        return future

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):  # evaluate_global and workers of a parallel executor
        return getattr(self.inner, name)


def run_engine(cfg: FedCureConfig, ds, workers: int) -> dict:
    """One engine run with ``workers`` processes: seconds of ``engine.run()``, steps, tasks."""
    fed = build_federation(cfg, ds)
    ex = CountingExecutor(make_executor(fed, workers))
    try:
        t0 = time.perf_counter()
        result = SimulationEngine(fed, ex).run()
        seconds = time.perf_counter() - t0
    finally:
        ex.close()
    evals = 1 + sum(r["accuracy"] is not None for r in result["records"])
    return {"seconds": seconds, "steps": ex.steps, "tasks": ex.tasks, "evals": evals,
            "accuracy": result["final_accuracy"]}


def bare_loop(ds, steps: int, evals: int, lr: float, batch: int, seed: int) -> float:
    """Seconds for ``steps`` plain SGD steps and ``evals`` test-set evaluations."""
    torch.manual_seed(seed)
    model = build_model("mnist", 10)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    xt, yt = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    model.train()
    n = x.shape[0]
    perm, pos = torch.randperm(n, generator=g), 0
    for _ in range(steps):
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=g), 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    for _ in range(evals):
        evaluate(model, xt, yt)
    return time.perf_counter() - t0


def flower_stock(data_dir: str, rounds: int, local_steps: int, clients: int, edges: int,
                 lr: float) -> dict:
    """Run ``bench/flower_stock`` in a child process; its JSON result."""
    over = {"data-dir": data_dir, "num-server-rounds": rounds, "local-steps": local_steps,
            "num-clients": clients, "num-edges": edges, "lr": lr, "clients-per-round": 10}
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "flower_stock" / "run_stock.py"),
                           json.dumps(over)], env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the Flower stock run failed:\n{proc.stdout[-2000:]}"
                           f"\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


class Hog:
    """A CPU-bound process occupying one core while the block runs (stopped by its PID)."""

    def __enter__(self) -> "Hog":
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    ap.add_argument("--rounds", type=int, default=20, help="global rounds (default 20)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--edges", type=int, default=5)
    ap.add_argument("--max-workers", type=int, default=available_cores(),
                    help="largest worker count of the scaling rows (default: the cores)")
    ap.add_argument("--no-hog", action="store_true", help="skip the row under a CPU hog")
    ap.add_argument("--no-flower", action="store_true", help="skip the Flower stock anchor")
    ap.add_argument("--bare", action="store_true", help="add the bare PyTorch loop row")
    ap.add_argument("--stock-aggregation", choices=["task", "edge-round", "both"],
                    default="both",
                    help="Flower stock's FedAvg rounds: one per coalition task (τ_c·τ_e steps "
                    "per message, the fewest messages), one per edge round (τ_c steps per "
                    "message: the edges' aggregation schedule, flat), or a row for each "
                    "(default)")
    args = ap.parse_args()
    threads = apply_thread_policy(where="bench/engine.py")
    cores = available_cores()
    cfg = apply_flat(FedCureConfig(), {
        "dataset": "mnist", "data-dir": args.data_dir, "num-clients": args.clients,
        "num-edges": args.edges, "tau-c": 5, "tau-e": 12, "batch-size": 32,
        "global-rounds": args.rounds, "eval-every": 5, "method": "fedcure", "seed": 0,
    })
    ds = load_dataset("mnist", args.data_dir)
    print(f"workload: MNIST, {args.clients} clients, {args.edges} ESs, tau_c=5, tau_e=12, "
          f"batch 32, {args.rounds} global rounds, eval every 5; {cores} cores, {threads} "
          f"torch thread(s) per process", flush=True)
    rows: list[tuple[str, float, int, str]] = []

    def add(name: str, seconds: float, steps: int, note: str = "") -> None:
        rows.append((name, seconds, steps, note))
        print(f"  {name:<34} {seconds:8.1f} s  {steps / seconds:8.1f} steps/s  {note}",
              flush=True)

    engine: dict[int, dict] = {}
    for w in range(1, max(1, args.max_workers) + 1):
        before = load()
        engine[w] = r = run_engine(cfg, ds, w)
        add(f"engine, {w} worker{'s' if w > 1 else ''}", r["seconds"], r["steps"],
            f"load {before} -> {load()}")
    ref = engine[1]
    full = engine[min(cores, max(engine))]
    hogged = None
    if not args.no_hog:
        before = load()
        with Hog():
            hogged = run_engine(cfg, ds, min(cores, max(engine)))
        add(f"engine, {min(cores, max(engine))} workers, 1 core hogged", hogged["seconds"],
            hogged["steps"], f"load {before} -> {load()}")
    if args.bare:
        add("bare PyTorch loop (1 process)",
            bare_loop(ds, ref["steps"], ref["evals"], cfg.method.lr, 32, 0), ref["steps"])
    stocks: dict[str, dict] = {}
    tau_c, tau_e = cfg.method.tau_c, cfg.method.tau_e
    schedules = {  # FedAvg rounds, local steps per message
        "task": (ref["tasks"], tau_c * tau_e),  # a Flower round per coalition task
        "edge-round": (ref["tasks"] * tau_e, tau_c),  # a Flower round per edge round
    }
    for name, (rounds, steps) in schedules.items():
        if args.no_flower or args.stock_aggregation not in (name, "both"):
            continue
        before = load()
        stocks[name] = stock = flower_stock(args.data_dir, rounds, steps, args.clients,
                                            args.edges, cfg.method.lr)
        add(f"Flower stock, FedAvg every {name} ({steps} steps/message)", stock["seconds"],
            stock["local_steps"],
            f"load {before} -> {load()}; with Ray start-up {stock['wall_seconds']:.1f} s")

    accs = {r["accuracy"] for r in [*engine.values(), *([hogged] if hogged else [])]}
    print()
    print("| run | seconds | local steps | local steps/s |")
    print("| --- | ---: | ---: | ---: |")
    for name, seconds, steps, _ in rows:
        print(f"| {name} | {seconds:.1f} | {steps} | {steps / seconds:.1f} |")
    print()
    sps = lambda r: r["steps"] / r["seconds"]  # noqa: E731
    for w, r in engine.items():
        print(f"scaling: {w} worker(s) = {sps(r) / sps(ref):.2f} x the sequential executor")
    if 2 in engine:
        s = sps(engine[2]) / sps(ref)
        print(f"goal --workers 2 >= 1.7 x sequential: {s:.2f} ({'PASS' if s >= 1.7 else 'FAIL'})")
    if hogged is not None:
        print(f"all cores with one core hogged: {hogged['seconds'] / full['seconds']:.2f} x "
              "the wall time without")
    for name, stock in stocks.items():
        s = sps(full) / (stock["local_steps"] / stock["seconds"])
        print(f"goal engine (all cores) >= 3 x Flower stock (FedAvg every {name}) steps/s: "
              f"{s:.2f} ({'PASS' if s >= 3 else 'FAIL'})")
    print(f"final accuracy equal in every engine row: {len(accs) == 1} ({sorted(accs)})")


if __name__ == "__main__":
    main()
