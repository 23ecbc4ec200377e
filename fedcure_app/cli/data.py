"""``fedcure data info``: a dataset's split sizes and class counts, and optionally a partition.

With ``--partition`` it also reports per-client and per-ES label counts and the initial average
pairwise JSD (nats) of the partition's edge servers; ``--json`` writes everything, ``--plot``
draws the per-ES label distribution.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

DATASET_CHOICES = ("digits", "mnist", "cifar10", "svhn", "cinic10")
PARTITION_CHOICES = ("edge-noniid", "dirichlet", "iid", "shards")
#: Per-client rows printed before the table is cut short (the JSON has them all).
MAX_CLIENT_ROWS = 60
#: option (argparse dest) -> the configuration key whose range check it shares
_OPTIONS: dict[str, str] = {
    "clients": "num-clients", "edges": "num-edges", "seed": "seed", "alpha": "dirichlet-alpha",
    "shards_per_client": "shards-per-client", "classes_per_edge": "classes-per-edge",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="inspect datasets and client partitions",
                       description="Inspect datasets and how they are split among clients.")
    data_sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    data_sub.required = True
    info = data_sub.add_parser(
        "info",
        help="split sizes, class counts and (optionally) a client partition",
        description="Load a dataset and print its split sizes and class counts; with "
        "--partition, also the per-client and per-ES label counts and the initial average "
        "pairwise Jensen-Shannon divergence (nats) between the edge servers.",
    )
    info.add_argument("--dataset", choices=DATASET_CHOICES, default="digits",
                      help="dataset (default digits, bundled with scikit-learn)")
    info.add_argument("--data-dir", help="root holding the dataset files "
                      "(default $FEDCURE_DATA_DIR or ./data)")
    info.add_argument("--no-cache", action="store_true", help="decode without the cache")
    info.add_argument("--download", action="store_true",
                      help="fetch missing files with torchvision (only where it imports)")
    info.add_argument("--partition", choices=PARTITION_CHOICES,
                      help="also split the training set among clients")
    info.add_argument("--clients", type=int, default=50, help="clients N (default 50)")
    info.add_argument("--edges", type=int, default=5, help="edge servers M (default 5)")
    info.add_argument("--seed", type=int, default=0, help="partition seed (default 0)")
    info.add_argument("--alpha", type=float, default=0.5,
                      help="Dirichlet concentration (default 0.5)")
    info.add_argument("--shards-per-client", type=int, default=2,
                      help="shards per client for 'shards' (default 2)")
    info.add_argument("--classes-per-edge", type=int, default=2,
                      help="classes per ES for 'edge-noniid' (default 2)")
    info.add_argument("--json", metavar="OUT.json", help="write the report as JSON here")
    info.add_argument("--plot", metavar="OUT.png",
                      help="draw the per-ES label distribution (needs --partition)")
    info.set_defaults(func=run_info)


def info_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Load the dataset (and partition it) and return the JSON-safe report."""
    from fedcure_app.data import load_dataset
    from fedcure_app.data.partition import partition_dataset

    from fedcure_app.cli.errors import at_least, check_dataset, check_new_file, checked_config

    if args.plot and not args.partition:
        raise ValueError("--plot needs --partition (it draws the partition's edge servers)")
    checked_config(args, _OPTIONS)
    at_least(args, "shards_per_client", 1)
    for dest in ("json", "plot"):
        if getattr(args, dest):
            check_new_file(getattr(args, dest), f"--{dest}")
    if not args.download:
        check_dataset(args.dataset, args.data_dir)
    started = time.perf_counter()
    ds = load_dataset(args.dataset, args.data_dir, cache=not args.no_cache,
                      download=args.download)
    out: dict[str, Any] = {
        "dataset": ds.name,
        "source": ds.source,
        "from_cache": ds.from_cache,
        "load_seconds": time.perf_counter() - started,
        "train_size": ds.train_size,
        "test_size": ds.test_size,
        "num_classes": ds.num_classes,
        "input_shape": list(ds.input_shape),
        "class_names": list(ds.class_names),
        "class_counts": {"train": ds.class_counts("train").tolist(),
                         "test": ds.class_counts("test").tolist()},
    }
    if args.partition:
        part = partition_dataset(
            ds.y_train, args.clients, args.edges, args.partition, seed=args.seed,
            alpha=args.alpha, shards_per_client=args.shards_per_client,
            classes_per_edge=args.classes_per_edge, num_classes=ds.num_classes,
        )
        out["partition"] = part.scheme
        out.update({k: v for k, v in part.to_dict().items() if k != "scheme"})
        if args.plot:
            from fedcure_app.data.plot import plot_label_distribution

            plot_label_distribution(
                part.label_counts, args.plot, assignment=part.initial_assignment,
                num_edges=part.num_edges, class_names=ds.class_names,
                title=f"{ds.name}: {part.scheme}, {part.num_clients} clients, "
                      f"{part.num_edges} ESs",
            )
            out["plot"] = str(args.plot)
    return out


def _count_table(title: str, row_label: str, rows: list[tuple[str, list[int]]],
                 class_names: list[str]):
    """A rich table of label counts (rows × classes + total); zeros shown as a dot."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column(row_label, no_wrap=True)
    for k, name in enumerate(class_names):
        widest = max([len(name)] + [len(str(c[k])) for _, c in rows])
        t.add_column(name, justify="right", no_wrap=True, min_width=widest)
    widest_total = max([5] + [len(str(sum(c))) for _, c in rows])
    t.add_column("total", justify="right", style="bold", no_wrap=True, min_width=widest_total)
    for label, counts in rows:
        t.add_row(label, *(str(v) if v else "·" for v in counts), str(sum(counts)))
    return t


def _table_width(table) -> int:
    """Characters the table needs without squeezing any column."""
    from rich.console import Console
    from rich.measure import Measurement

    return Measurement.get(Console(width=10_000), Console(width=10_000).options, table).maximum


def _render(out: dict[str, Any], print_) -> None:
    names = out["class_names"]
    print_(
        f"[bold]{out['dataset']}[/bold] from {out['source']}"
        f"{' (cache)' if out['from_cache'] else ''}: {out['train_size']:,} train, "
        f"{out['test_size']:,} test, {out['num_classes']} classes, input "
        f"{'×'.join(map(str, out['input_shape']))}, loaded in {out['load_seconds']:.2f} s"
    )
    print_(_count_table("class counts", "split", [
        ("train", out["class_counts"]["train"]), ("test", out["class_counts"]["test"])], names))
    if "partition" not in out:
        return
    assign = out["initial_assignment"]
    rows = [(f"{i} (ES {assign[i]})", c)
            for i, c in enumerate(out["client_label_counts"][:MAX_CLIENT_ROWS])]
    extra = out["num_clients"] - len(rows)
    print_(_count_table(
        f"client label counts ({out['partition']}, seed {out['seed']})", "client", rows, names))
    if extra > 0:
        print_(f"… {extra} more clients (all of them in --json)")
    sizes = [assign.count(m) for m in range(out["num_edges"])]
    print_(_count_table(
        "edge-server label counts (initial association)", "ES",
        [(f"{m} ({sizes[m]} clients)", c) for m, c in enumerate(out["edge_label_counts"])],
        names))
    print_(f"initial average pairwise JSD: {out['initial_jsd']:.4f} nats "
           "(ln 2 = 0.6931 is fully disjoint)")


def run_info(args: argparse.Namespace) -> int:
    from rich.console import Console

    out = info_from_args(args)
    pending: list[Any] = []
    _render(out, pending.append)
    console = Console()
    # Never squeeze counts into "59…": widen past the terminal if a table needs it.
    need = max((_table_width(x) for x in pending if not isinstance(x, str)), default=0)
    if need > console.width:
        console = Console(width=need)
    for item in pending:
        console.print(item)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        console.print(f"wrote {path}")
    if args.plot:
        console.print(f"wrote {args.plot}")
    return 0
