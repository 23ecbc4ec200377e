"""A client's own data (``fedcure-client --data PATH``), read in a child process.

The cloud of a task (``fedcure-cloud --task``) hands every client the task with its
configuration (``Association.Claim``); the client reads only PATH under it, in a child so that
the long-lived role never loads NumPy, Pillow or torch::

    python -m client.own_data --config FILE --data PATH --index I --name NAME --out FILE \\
        [--label-column C] [--holdout F] [--histogram-epsilon E] [--histogram-min-count K]

The child maps every label to the task's class list by name, holds out a seeded, stratified
fraction for federated evaluation when PATH has no ``test/`` part, builds the task's model
(so a model import path that does not import here is refused before registration) and writes
the node data file (:mod:`fedcure_app.flower.node_data`: training and held-out parts, the
task). It prints one JSON line: the training sample count, the label histogram over the task's
classes (Laplace noise of scale 1/ε with ``--histogram-epsilon``,
:func:`fedcure_app.core.privacy.private_histogram`), the initial ES, the device profile and the
model's signature, which is all the client reports at registration. A refusal is one line on
standard error and exit code :data:`EXIT_REFUSED`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fedcure_app.flower.own_node import DataRefused, own_node_data

#: exit code of the child when the data or the model is refused (one line on stderr)
EXIT_REFUSED = 3
#: how the child's refusal line starts: ``refused[CODE:COUNT] line`` (:func:`tag_refusal`)
_TAG = "refused["
_TAGGED = re.compile(r"^refused\[([a-z-]+):([0-9]*)\] (.*)$")


def read_own_data(cfg: Any, index: int, name: str, out: Path, *, data: str,
                  label_column: str | None, holdout: float | None, epsilon: float,
                  min_count: int, timeout_s: float = 1800.0,
                  stop: threading.Event | None = None) -> Any:
    """Client ``index``'s own data at ``data`` under ``cfg.task``, written to ``out`` by a
    child process: a :class:`client.partition.Partition` (None when ``stop`` is set first);
    :class:`DataRefused` in one line when the data or the model is refused."""
    from client.association import ClientError
    from client.children import ChildFailed
    from client.partition import run_data_child

    args = ["--data", str(data), "--index", str(index), "--name", name,
            "--histogram-epsilon", repr(float(epsilon)),
            "--histogram-min-count", str(int(min_count))]
    if label_column is not None:
        args += ["--label-column", label_column]
    if holdout is not None:
        args += ["--holdout", repr(float(holdout))]
    try:
        return run_data_child(cfg, "client.own_data", args, out, timeout_s, stop)
    except subprocess.TimeoutExpired:
        raise ClientError(f"reading {data} took more than {timeout_s:.0f} s") from None
    except ChildFailed as err:
        if err.returncode == EXIT_REFUSED:
            raise untag_refusal(err.tail) from None
        raise ClientError(f"reading {data} failed: {err.tail}") from None


def tag_refusal(err: BaseException) -> str:
    """The child's line for a refusal: its code and count
    (:func:`fedcure_app.protocol.withdraw.withdraw_code`) in a tag, then the line itself."""
    from fedcure_app.protocol.withdraw import withdraw_code

    code, count = withdraw_code(err)
    return f"{_TAG}{code}:{'' if count is None else count}] {' '.join(str(err).split())}"


def untag_refusal(line: str) -> DataRefused:
    """The refusal a child's :func:`tag_refusal` line stands for (an untagged line: a
    refusal of code ``data-refused``)."""
    m = _TAGGED.match(line)
    if m is None:
        return DataRefused(line)
    return DataRefused(m.group(3), m.group(1), int(m.group(2)) if m.group(2) else None)


def build_own_node_data(cfg: Any, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The node data of ``args.data`` under ``cfg.task`` and the facts the role registers
    with (:func:`fedcure_app.flower.own_node.own_node_data`)."""
    return own_node_data(cfg, args.data, index=args.index, name=args.name,
                         label_column=args.label_column, holdout=args.holdout,
                         epsilon=float(args.histogram_epsilon),
                         min_count=args.histogram_min_count)


def main(argv: list[str] | None = None) -> int:
    """The child: read, check, write, print the facts as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m client.own_data",
                                description="Read one client's own data into a node data file.")
    p.add_argument("--config", required=True, help="the run's configuration (JSON file)")
    p.add_argument("--data", required=True, help="the client's data")
    p.add_argument("--index", required=True, type=int, help="the client's claimed index")
    p.add_argument("--name", required=True, help="the client's name (kept in the file)")
    p.add_argument("--out", required=True, help="node data file to write (.npz)")
    p.add_argument("--label-column", help="label column of CSV data")
    p.add_argument("--holdout", type=float, help="held-out fraction")
    p.add_argument("--histogram-epsilon", type=float, default=0.0, help="0: exact counts")
    p.add_argument("--histogram-min-count", type=int, default=0)
    args = p.parse_args(argv)
    from fedcure_app.config import build_config
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.flower.node_data import save_node_data
    from fedcure_app.models import ModelImportError

    try:
        cfg = build_config(json.loads(Path(args.config).read_text()))
        if cfg.task is None:
            raise DataRefused("the cloud runs a built-in dataset, not a task: --data needs a "
                              "cloud started with --task")
        data, facts = build_own_node_data(cfg, args)
        save_node_data(args.out, data)
    except (DataRefused, DatasetError, ModelImportError) as err:
        print(tag_refusal(err), file=sys.stderr)
        return EXIT_REFUSED
    except (OSError, ValueError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
