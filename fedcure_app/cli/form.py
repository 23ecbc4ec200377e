"""``fedcure form``: coalition formation on synthetic label counts, without any dataset.

Builds per-client label counts with :func:`fedcure_app.core.layout.synthetic_label_counts`, runs a
preference rule (``fedcure``, ``selfish``, ``pareto``) or a clustering baseline (``kmeans``,
``meanshift``; ``none`` keeps the initial layout), prints a summary and optionally writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

RULE_CHOICES = ("fedcure", "selfish", "pareto", "kmeans", "meanshift", "none")
PARTITION_CHOICES = ("edge-noniid", "dirichlet", "iid")
#: option (argparse dest) -> the configuration key whose range check it shares
_OPTIONS: dict[str, str] = {
    "clients": "num-clients", "edges": "num-edges", "classes": "num-classes",
    "classes_per_edge": "classes-per-edge", "alpha": "dirichlet-alpha", "seed": "seed",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "form",
        help="form coalitions (client -> edge server) on synthetic label counts",
        description="Run coalition formation on synthetic per-client label counts and report "
        "the average pairwise Jensen-Shannon divergence (nats) before and after.",
    )
    p.add_argument("--clients", type=int, default=50, help="number of clients N (default 50)")
    p.add_argument("--edges", type=int, default=5, help="number of edge servers M (default 5)")
    p.add_argument("--classes", type=int, default=10, help="number of classes C (default 10)")
    p.add_argument("--partition", choices=PARTITION_CHOICES, default="edge-noniid",
                   help="initial label layout (default edge-noniid)")
    p.add_argument("--alpha", type=float, default=0.5,
                   help="Dirichlet concentration for --partition dirichlet (default 0.5)")
    p.add_argument("--samples-per-client", type=int, default=100,
                   help="samples per client (default 100)")
    p.add_argument("--classes-per-edge", type=int, default=2,
                   help="classes per ES in the edge non-IID layout (default 2)")
    p.add_argument("--rule", choices=RULE_CHOICES, default="fedcure",
                   help="preference rule or clustering baseline (default fedcure)")
    p.add_argument("--capacity", type=int, default=None,
                   help="at most this many clients per ES (preference rules only)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--max-moves", type=int, default=None,
                   help="stop after this many moves (default: until stable; selfish: 20·N)")
    p.add_argument("--json", metavar="OUT.json", help="write the result as JSON here")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Range checks of the options (the configuration schema's, for the options it shares),
    raising :class:`~fedcure_app.cli.errors.UsageError` naming the option."""
    from fedcure_app.cli.errors import UsageError, at_least, check_new_file, checked_config

    checked_config(args, _OPTIONS)
    if args.partition == "edge-noniid" and args.classes_per_edge > args.classes:
        raise UsageError(f"--classes-per-edge ({args.classes_per_edge}) must be <= --classes "
                         f"({args.classes}) for --partition edge-noniid")
    at_least(args, "samples_per_client", 1)
    at_least(args, "capacity", 1)
    at_least(args, "max_moves", 0)
    if args.json:
        check_new_file(args.json, "--json")


def form_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Build the synthetic federation, run the rule, return the JSON-safe result."""
    from fedcure_app.core.coalition import run_formation
    from fedcure_app.core.layout import synthetic_label_counts

    check_args(args)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    counts, initial = synthetic_label_counts(
        args.clients, args.edges, args.classes, args.partition,
        samples_per_client=args.samples_per_client, alpha=args.alpha,
        classes_per_edge=args.classes_per_edge, seed=args.seed,
    )
    started = time.perf_counter()
    result = run_formation(counts, initial, args.edges, args.rule, capacity=args.capacity,
                           max_moves=args.max_moves, seed=args.seed)
    seconds = time.perf_counter() - started
    out = result.to_dict()
    coalitions = result.coalitions(args.edges)
    out.update(
        coalitions=coalitions,
        coalition_sizes=[len(c) for c in coalitions],
        seconds=seconds,
        arguments={
            "clients": args.clients, "edges": args.edges, "classes": args.classes,
            "partition": args.partition, "alpha": args.alpha,
            "samples_per_client": args.samples_per_client,
            "classes_per_edge": args.classes_per_edge, "rule": args.rule,
            "capacity": args.capacity, "seed": args.seed, "max_moves": args.max_moves,
        },
    )
    return out


def _summary(out: dict[str, Any]):
    from rich.table import Table

    a = out["arguments"]
    t = Table(title="FedCure coalition formation", show_header=False)
    t.add_row("rule", a["rule"])
    t.add_row("clients / ESs / classes", f"{a['clients']} / {a['edges']} / {a['classes']}")
    t.add_row("partition", a["partition"] + (f" (α={a['alpha']})"
                                            if a["partition"] == "dirichlet" else ""))
    t.add_row("average JSD initial → final",
              f"{out['initial_jsd']:.4f} → {out['final_jsd']:.4f} nats")
    t.add_row("moves", str(out["moves"]))
    t.add_row("stable", "yes" if out["stable"] else "no")
    sizes = out["coalition_sizes"]
    t.add_row("coalition sizes", f"min {min(sizes)}, max {max(sizes)}")
    t.add_row("time", f"{out['seconds']:.3f} s")
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    out = form_from_args(args)
    console = Console()
    console.print(_summary(out))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        console.print(f"wrote {path}")
    return 0
