"""``fedcure experiment peers``: FedCure and the four peers on one or more settings (a built-in
dataset with the paper's 50 clients and 5 edges or ``--clients/--edges``, or the user's own
folders with ``--task/--clients-data``), every method under the same simulated time budget
(:mod:`fedcure_app.experiments.peers`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: Simulated seconds each method runs, per setting kind, at the quick budget (``--time-budget``
#: overrides): long enough that the fastest method's accuracy flattens on an idle 2-core CPU
#: within minutes per run (docs/benchmarks.md, "Against the peers").
DEFAULT_TIME_BUDGET_S: dict[str, float] = {"digits": 5.0, "mnist": 20.0, "own": 5.0}


def add_peer_options(p: argparse.ArgumentParser) -> None:
    """The options only ``fedcure experiment peers`` takes."""
    g = p.add_argument_group("peers only")
    g.add_argument("--clients", type=int, help="clients (default: the budget's, 50); the "
                   "setting is then named DATASET-CLIENTS")
    g.add_argument("--edges", type=int, help="edge servers (default: the budget's, 5)")
    g.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="simulated seconds every method runs (default: "
                   + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_TIME_BUDGET_S.items()) + ")")
    g.add_argument("--task", metavar="FILE", help="task file of the user's own data "
                   "(instead of --dataset; the setting is named 'own')")
    g.add_argument("--clients-data", metavar="DIR", help="with --task: one entry per client")
    g.add_argument("--with-options", "--with-k-m", dest="peer_variants", action="store_true",
                   help="also FedCure with the options that close its gap to the peers: every "
                   "coalition training at once (K = M), and each coalition model taken whole "
                   "(cloud mixing weight ℓ = 1)")


def _settings(args: argparse.Namespace) -> list[tuple[str, Any, Any, Any]]:
    """(setting name, loaded dataset, base configuration, budget) per setting asked for."""
    from fedcure_app.cli.errors import UsageError
    from fedcure_app.cli.own_data import apply_task
    from fedcure_app.config import apply_flat
    from fedcure_app.data import DatasetError, load_dataset
    from fedcure_app.data.own_federation import load_federation_data
    from fedcure_app.experiments.budget import base_config, get_budget
    from fedcure_app.experiments.suite import parse_datasets

    common: dict[str, Any] = {}
    if args.executor:
        common["executor"] = args.executor
    if args.task:
        b = get_budget(args.budget, "digits", args.seeds)
        ns = argparse.Namespace(task=args.task, clients_data=args.clients_data, holdout=None,
                                label_column=None, test_data=None, dataset=None,
                                clients=None, edges=args.edges)
        base = apply_flat(base_config("digits", None, b), common)
        flat = b.overrides()
        flat.pop("num-clients"), flat.pop("num-edges")
        if args.edges is not None:  # apply_task only checks it against the clients
            flat["num-edges"] = args.edges
        cfg = apply_task(apply_flat(base, flat), ns)
        return [("own", load_federation_data(cfg), cfg, b)]
    out = []
    for name in parse_datasets(args.dataset):
        b = get_budget(args.budget, name, args.seeds)
        flat = dict(common)
        if args.clients is not None:
            flat["num-clients"] = args.clients
        if args.edges is not None:
            flat["num-edges"] = args.edges
        cfg = apply_flat(base_config(name, args.data_dir, b), flat)
        try:
            dataset = load_dataset(name, args.data_dir)
        except DatasetError as err:
            raise UsageError(f"--dataset {name}: {err}") from None
        setting = name if args.clients is None else f"{name}-{args.clients}"
        out.append((setting, dataset, cfg, b))
    return out


def run_peers(args: argparse.Namespace, workers: int | None, device: Any, progress: Any
              ) -> list[Any]:
    """Every setting's section (written under ``--out``)."""
    from fedcure_app.cli.errors import UsageError
    from fedcure_app.experiments.jobs import run_parallel
    from fedcure_app.experiments.peers import run_setting
    from fedcure_app.experiments.runner import Runner

    if args.clients_data and not args.task:
        raise UsageError("--clients-data: only with --task")
    if args.time_budget is not None and not args.time_budget > 0:
        raise UsageError(f"--time-budget must be > 0 simulated seconds, got {args.time_budget}")
    out = Path(args.out)
    sections = []
    for setting, dataset, cfg, b in _settings(args):
        kind = "own" if setting == "own" else setting.split("-")[0]
        budget_s = args.time_budget or DEFAULT_TIME_BUDGET_S.get(kind, 10.0)
        runner = Runner(dataset, out / setting / "runs", progress=progress, fresh=args.fresh,
                        workers=workers, device=device, cache_only=args.cache_only,
                        jobs=args.jobs, parallel=run_parallel if args.jobs > 1 else None)
        sections.append(run_setting(setting, runner, cfg, out, seeds=b.seeds,
                                    budget_s=budget_s, eval_samples=b.eval_samples,
                                    variants=args.peer_variants))
    return sections


__all__ = ["DEFAULT_TIME_BUDGET_S", "add_peer_options", "run_peers"]
