"""The options that run a federation over the clients' own data (``--task``,
``--clients-data``, ``--holdout``, ``--label-column``), shared by ``fedcure simulate`` and
``fedcure launch``: checked before anything starts, each mistake one line naming the option."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedcure_app.cli.errors import UsageError
from fedcure_app.config import ConfigError, FedCureConfig, build_config


def add_task_options(p: argparse.ArgumentParser) -> None:
    """Add the own-data options to a sub-command's parser."""
    g = p.add_argument_group("own data (instead of --dataset; docs/own-data.md)")
    g.add_argument("--task", metavar="FILE",
                   help="task file (task.toml: classes, input shape, normalisation, model; "
                   "`fedcure task init` writes one)")
    g.add_argument("--clients-data", metavar="DIR",
                   help="with --task: one entry per client (a folder of class folders, an "
                   ".npz, a .csv, a datasets.save_to_disk folder), sorted by name; client i "
                   "gets entry i and nothing else; the number of entries is the number of "
                   "clients")
    g.add_argument("--holdout", type=float,
                   help="with --task: fraction of each client's data held out (seeded, "
                   "stratified) for federated evaluation when it has no test/ part "
                   "(default 0.1)")
    g.add_argument("--label-column", help="with --task: the label column of CSV data "
                   "(default label)")
    g.add_argument("--test-data", metavar="PATH",
                   help="with --task: a central test set in any format a client reads (all of "
                   "it is test data): the global model is evaluated on it, and the clients "
                   "train on all their data unless --holdout is given")
    p.add_argument("--init-model", metavar="FILE",
                   help="start from this model instead of a fresh one: a model.pt, model.pt2 "
                   "or .safetensors of the same task (a finished run's model.pt, say)")


def apply_task(cfg: FedCureConfig, args: argparse.Namespace) -> FedCureConfig:
    """``cfg`` with the task of ``--task`` and the clients of ``--clients-data`` (clients = the
    number of entries; edges = --edges, else at most the configured number and the clients);
    unchanged without ``--task``. :class:`UsageError` names the option at fault."""
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.data.own import client_entries
    from fedcure_app.data.own_federation import with_task
    from fedcure_app.data.task import TaskFileError, load_task

    task_file = getattr(args, "task", None)
    if task_file is None:
        for flag in ("clients_data", "holdout", "label_column", "test_data"):
            if getattr(args, flag, None) is not None:
                raise UsageError(f"--{flag.replace('_', '-')}: only with --task")
        return cfg
    if getattr(args, "dataset", None):
        raise UsageError(f"--dataset {args.dataset}: not used with --task (the task file "
                         "names the data's classes and shape)")
    try:
        task = load_task(task_file)
    except TaskFileError as err:
        raise UsageError(f"--task: {err}") from None
    if not args.clients_data:
        raise UsageError("--task needs --clients-data DIR (one entry per client)")
    try:
        entries = client_entries(args.clients_data)
    except DatasetError as err:
        raise UsageError(f"--clients-data: {err}") from None
    n = len(entries)
    if getattr(args, "clients", None) is not None and args.clients != n:
        raise UsageError(f"--clients {args.clients}: --clients-data {args.clients_data} holds "
                         f"{n} client entries (leave --clients out)")
    if getattr(args, "edges", None) is not None and args.edges > n:
        raise UsageError(f"--edges ({args.edges}) > the {n} clients of --clients-data: every "
                         "edge server needs at least one client")
    data: dict[str, Any] = cfg.model_dump()
    data["data"]["clients_data"] = str(args.clients_data)
    if args.holdout is not None:
        data["data"]["holdout"] = args.holdout
    elif getattr(args, "test_data", None) is not None:
        data["data"]["holdout"] = 0.0  # a central test set: the clients train on all they hold
    if getattr(args, "test_data", None) is not None and not Path(args.test_data).exists():
        raise UsageError(f"--test-data {args.test_data}: no such file or folder")
    if args.label_column is not None:
        data["data"]["label_column"] = args.label_column
    try:  # one client per entry, edges at most the clients (checked above for --edges)
        return with_task(build_config(data), task)
    except ConfigError as err:
        raise UsageError(str(err)) from None


def init_arrays(cfg: FedCureConfig, args: argparse.Namespace) -> list | None:
    """The weights of ``--init-model`` checked against the run's task (None without it);
    :class:`UsageError` in one line for a file that is not the task's model."""
    path = getattr(args, "init_model", None)
    if path is None:
        return None
    from fedcure_app.trained.files import ModelFileError, load_weights, run_task

    try:
        return load_weights(path, run_task(cfg))
    except ModelFileError as err:
        raise UsageError(f"--init-model: {err}") from None


def cloud_flags(args: argparse.Namespace) -> list[str]:
    """``--test-data`` and ``--init-model`` as the cloud of a launch takes them (absolute
    paths): it evaluates on the one and starts from the other."""
    out: list[str] = []
    for flag in ("test_data", "init_model"):
        if getattr(args, flag, None) is not None:
            out += [f"--{flag.replace('_', '-')}", str(Path(getattr(args, flag)).resolve())]
    return out


__all__ = ["add_task_options", "apply_task", "cloud_flags", "init_arrays"]
