"""How far inside the cloud's step bound real edge models land (docs/security.md, "The norm
screen").

For each configuration it runs the simulation (in-process, one worker, seed 0) and prints the
step bound lr·τ_c·τ_e·G (G = ``reliability.norm-grad-bound``), the first edge model's distance
from the global model (the ``edge_distance`` the records keep: what the cloud's screen measures),
the largest over the run, and the margin bound / largest. With ``--gradients`` it also prints the
largest mini-batch gradient L2 norm over 300 plain SGD steps (lr 0.01, batch 32) of one model
cycling through the clients' data: what G must bound.

    python3 bench/norm_margin.py [--configs digits,digits-tau-e-2,testbed,mnist,cifar10]
                                 [--data-dir DIR] [--gradients]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: name -> (dataset, rounds, flat configuration overrides)
CONFIGS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "digits": ("digits", 20, {}),
    "digits-tau-e-2": ("digits", 6, {"tau-e": 2}),
    # fedcure testbed's defaults (fedcure_app/cli/testbed.py TESTBED_DEFAULTS, 9 clients, 3 edges)
    "testbed": ("digits", 20, {"tau-c": 30, "tau-e": 2, "lr": 0.05, "partition": "dirichlet",
                               "num-clients": 9, "num-edges": 3, "max-concurrent": 1}),
    "mnist": ("mnist", 6, {}),
    "cifar10": ("cifar10", 3, {}),
}


def config(name: str, data_dir: str | None) -> Any:
    from fedcure_app.config import FedCureConfig, apply_flat

    dataset, rounds, flat = CONFIGS[name]
    base: dict[str, Any] = {"dataset": dataset, "global-rounds": rounds, "eval-every": 1000}
    if data_dir:
        base["data-dir"] = data_dir
    return apply_flat(FedCureConfig(), {**base, **flat})


def margin(name: str, data_dir: str | None) -> str:
    from cloud_server.screening import step_bound
    from fedcure_app.simulation.engine import simulate

    cfg = config(name, data_dir)
    records = simulate(cfg, workers=1)["records"]
    dists = [r["edge_distance"] for r in records]
    bound = step_bound(cfg)
    m = cfg.method
    return (f"{name:15s} lr {m.lr:g} τ_c {m.tau_c} τ_e {m.tau_e}: step bound {bound:.4g}, "
            f"first {dists[0]:.3f}, largest {max(dists):.3f} of {len(dists)}, "
            f"margin {bound / max(dists):.0f}×")


def gradients(name: str, data_dir: str | None, steps: int = 300) -> str:
    import numpy as np
    import torch

    from fedcure_app.models import build_model, set_weights
    from fedcure_app.simulation.engine import build_federation

    cfg = config(name, data_dir)
    fed = build_federation(cfg)
    x, y = torch.from_numpy(fed.dataset.x_train), torch.from_numpy(fed.dataset.y_train)
    model = build_model(cfg.data.dataset, cfg.federation.num_classes)
    set_weights(model, fed.initial_arrays)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    clients = fed.partition.client_indices
    norms = []
    for step in range(steps):
        idx = torch.as_tensor(np.asarray(clients[step % len(clients)]))
        batch = idx[torch.randint(len(idx), (32,), generator=gen)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        norms.append(float(torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))))
        opt.step()
    return (f"{name:15s} mini-batch gradient L2 norm over {steps} steps: first "
            f"{norms[0]:.2f}, median {float(np.median(norms)):.2f}, largest {max(norms):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--gradients", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    for name in args.configs.split(","):
        print(margin(name, args.data_dir), flush=True)
        if args.gradients:
            print(gradients(name, args.data_dir), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
