"""What a private label histogram costs: coalition formation and accuracy at several ε.

Each client may report its label histogram with Laplace noise of scale 1/ε
(``data.histogram-epsilon``; ``fedcure-client --histogram-epsilon``). Formation then moves
clients by the noisy histograms; this bench simulates the per-client-folder example
(``examples/digits_folders.py``; by default 16 clients holding two digits each, 8×8 pixels,
4 edge servers, so that the initial coalitions differ and formation has work to do) at each ε
and reports, per ε, the average pairwise JSD of the formed coalitions measured on the *true*
histograms (what formation was after), the initial JSD, and the federated final accuracy, each
as the mean (and range) over seeds.

    python3 bench/histogram_privacy.py [--eps inf 10 1 0.1] [--seeds 0 1 2] [--rounds 20]
        [--clients 16] [--classes-per-client 2] [--size 8] [--edges 4] [--clients-data DIR]
        [--json FILE]

Without --clients-data the example is written to a temporary folder first. One process, one
torch thread: it prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_one(task, clients: Path, eps: float, seed: int, rounds: int, edges: int) -> dict:
    """One in-process simulation at ``eps`` (inf: exact histograms) and ``seed``."""
    from fedcure_app.config import FedCureConfig, apply_flat
    from fedcure_app.data.own_federation import with_task
    from fedcure_app.simulation.engine import simulate

    cfg = apply_flat(FedCureConfig(), {"clients-data": str(clients), "num-edges": edges,
                                       "global-rounds": rounds, "seed": seed,
                                       "histogram-epsilon": 0.0 if math.isinf(eps) else eps})
    cfg = with_task(cfg, task)
    t0 = time.perf_counter()
    result = simulate(cfg)
    return {"eps": eps, "seed": seed, "initial_jsd": result["initial_jsd"],
            "formed_jsd": result["formed_jsd"], "initial_accuracy": result["initial_accuracy"],
            "final_accuracy": result["final_accuracy"], "seconds": time.perf_counter() - t0}


def summary(rows: list[dict], eps_list: list[float]) -> list[dict]:
    out = []
    for eps in eps_list:
        sel = [r for r in rows if r["eps"] == eps]
        jsd = [r["formed_jsd"] for r in sel]
        acc = [r["final_accuracy"] for r in sel]
        out.append({"eps": eps, "runs": len(sel),
                    "initial_jsd": statistics.mean(r["initial_jsd"] for r in sel),
                    "formed_jsd_mean": statistics.mean(jsd), "formed_jsd_min": min(jsd),
                    "formed_jsd_max": max(jsd), "final_accuracy_mean": statistics.mean(acc),
                    "final_accuracy_min": min(acc), "final_accuracy_max": max(acc)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eps", type=float, nargs="+", default=[math.inf, 10.0, 1.0, 0.1])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--classes-per-client", type=int, default=2)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--edges", type=int, default=4)
    p.add_argument("--clients-data", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    os.environ.setdefault("FEDCURE_NUM_THREADS", "1")
    from fedcure_app.data.own import infer_task

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        clients = args.clients_data
        if clients is None:
            clients = Path(tmp) / "clients"
            subprocess.run([sys.executable, str(REPO / "examples" / "digits_folders.py"),
                            str(clients), "--clients", str(args.clients),
                            "--classes-per-client", str(args.classes_per_client),
                            "--size", str(args.size)], check=True, capture_output=True)
        task, _ = infer_task(clients)
        rows = []
        for eps in args.eps:
            for seed in args.seeds:
                row = run_one(task, clients, eps, seed, args.rounds, args.edges)
                rows.append(row)
                print(f"ε={eps:g} seed {seed}: JSD {row['initial_jsd']:.4f} -> "
                      f"{row['formed_jsd']:.4f}, accuracy {row['initial_accuracy']:.3f} -> "
                      f"{row['final_accuracy']:.3f} ({row['seconds']:.0f} s)", flush=True)
    table = summary(rows, args.eps)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n| ε | initial JSD | formed JSD (mean, min–max) | final accuracy (mean, min–max) |")
    print("| ---: | ---: | ---: | ---: |")
    for r in table:
        print(f"| {r['eps']:g} | {r['initial_jsd']:.3f} | {r['formed_jsd_mean']:.3f} "
              f"({r['formed_jsd_min']:.3f}–{r['formed_jsd_max']:.3f}) | "
              f"{100 * r['final_accuracy_mean']:.1f} % ({100 * r['final_accuracy_min']:.1f}–"
              f"{100 * r['final_accuracy_max']:.1f}) |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
