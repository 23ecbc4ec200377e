"""``fedcure task init``: a task file (``task.toml``) from the clients' own data.

    fedcure task init DATA [--out task.toml] [--model NAME] [--label-column label] [--force]

DATA is a folder of client entries (each a folder of class folders, an ``.npz``, a ``.csv`` or a
``datasets.save_to_disk`` folder) or one client's data. It prints what it found (clients, their
samples and classes, the kind, the class list, the input shape or feature count, mean/std) and
writes the task (:func:`fedcure_app.data.own.infer_task`). An existing ``--out`` is kept unless
``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: Class names listed per client before the line is cut short.
_SHOWN = 12


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("task", help="write a task file for the clients' own data",
                       description="Task files (task.toml): the one description of a learning "
                       "task over the clients' own data that every role shares.")
    task_sub = p.add_subparsers(dest="task_command", metavar="SUBCOMMAND")
    task_sub.required = True
    init = task_sub.add_parser(
        "init", help="infer a task file from the clients' data",
        description="Read DATA (a folder of client entries: folders of class folders, .npz, "
        ".csv or datasets.save_to_disk folders; or one client's data) and write a task file: "
        "the kind, the union of class names, the input shape (the most common image size) or "
        "feature count, per-channel or per-feature mean/std, the model.")
    init.add_argument("data", metavar="DATA", help="folder of client entries, or one client's "
                      "data")
    init.add_argument("--out", default="task.toml", metavar="FILE",
                      help="task file to write")
    init.add_argument("--model", default=None, metavar="NAME",
                      help="built-in model (digits, mnist, cifar10, cnn, mlp) or import path "
                      "package.module:factory (default: cnn for images, mlp for tables)")
    init.add_argument("--label-column", default="label", metavar="NAME",
                      help="label column of CSV files and datasets folders")
    init.add_argument("--force", action="store_true", help="overwrite an existing --out")
    init.set_defaults(func=run_init)


def _names(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f", … ({more} more)" if more > 0 else "")


def _numbers(values: list[float] | None) -> str:
    if not values:
        return "-"
    shown = ", ".join(f"{v:.4g}" for v in values[:8])
    return f"[{shown}{', …' if len(values) > 8 else ''}]"


def report(task: Any, summary: dict[str, Any]) -> list[str]:
    """The lines ``task init`` prints about what it found."""
    clients = summary["clients"]
    lines = [f"found {len(clients)} client{'s' if len(clients) != 1 else ''} in "
             f"{summary['path']} ({task.kind} data)"]
    width = max(len(c["name"]) for c in clients)
    for c in clients:
        test = f", {c['test']} test" if c["test"] else ""
        lines.append(f"  {c['name']:<{width}}  {c['format']:<8} {c['train']} samples{test}, "
                     f"{len(c['classes'])} classes: {_names(list(c['classes']))}")
    lines.append(f"classes ({task.num_classes}): {_names(task.classes)}")
    if task.kind == "image":
        sizes = ", ".join(f"{k}: {n}" for k, n in summary["sizes"].items())
        modes = ", ".join(f"{k}: {n}" for k, n in summary["modes"].items())
        c, h, w = task.input_shape
        lines.append(f"input shape [C, H, W] = [{c}, {h}, {w}] (sizes seen: {sizes}; "
                     f"modes: {modes})")
        if len(summary["sizes"]) > 1:
            lines.append(f"note: images not {w}×{h} are refused by their client unless the "
                         "task says resize = true")
        lines.extend(f"note: {note}" for note in summary.get("notes", []))
    else:
        lines.append(f"features: {task.features}")
    lines.append(f"mean {_numbers(task.mean)}, std {_numbers(task.std)}")
    lines.append(f"model: {task.model}")
    return lines


def run_init(args: argparse.Namespace) -> int:
    from fedcure_app.data.own import infer_task
    from fedcure_app.data.task import load_task, task_toml
    from fedcure_app.errors import UsageError

    from fedcure_app.cli.errors import check_new_file

    out = Path(args.out)
    check_new_file(out, "--out")
    if out.exists() and not args.force:
        raise UsageError(f"--out {out}: exists; pass --force to overwrite it")
    task, summary = infer_task(args.data, args.model, label_column=args.label_column)
    for line in report(task, summary):
        print(line)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(task_toml(task), encoding="utf-8")
    load_task(out)  # what was written reads back
    print(f"wrote {out}")
    return 0
