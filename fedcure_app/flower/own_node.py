"""A node's own data under a task, as the node data file the ClientApp trains from.

One builder for both ways a client names its data: ``fedcure-client --data PATH`` (whose child,
:mod:`client.own_data`, calls :func:`own_node_data` and registers with the facts it returns) and
Flower's ``data-path`` node config of a SuperNode under the FedCure ClientApp
(:func:`node_file_for_path`: the file is built once per path, task and hold-out into the cache
folder, ``$FEDCURE_CACHE_DIR`` or ``~/.cache/fedcure``, never into the data folder).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from logging import INFO
from pathlib import Path
from typing import Any


class DataRefused(ValueError):
    """The node's data or model cannot be used under the task (one line); ``code`` and
    ``count`` as :class:`fedcure_app.data.errors.ClientDataError` has them."""

    def __init__(self, message: str, code: str = "data-refused", count: int | None = None
                 ) -> None:
        super().__init__(message)
        self.code, self.count = code, count


def own_node_data(cfg: Any, data: str | Path, *, index: int, name: str,
                  label_column: str | None = None, holdout: float | None = None,
                  epsilon: float = 0.0, min_count: int = 0) -> tuple[Any, dict[str, Any]]:
    """The node data of ``data`` under ``cfg.task`` (client ``index`` of the run) and the facts
    a client registers with: training samples, the label histogram over the task's classes
    (Laplace noise of scale 1/ε when ``epsilon`` > 0), the initial ES, the device profile and
    the model's signature. :class:`DataRefused` (or a
    :class:`~fedcure_app.data.errors.DatasetError`, a
    :class:`~fedcure_app.models.ModelImportError`) in one line when it cannot be used."""
    import numpy as np

    from fedcure_app.core.privacy import private_histogram
    from fedcure_app.data.own import normalise_x, pixel_norm, read_client_data
    from fedcure_app.data.own_federation import initial_edges
    from fedcure_app.federation import profiles_for
    from fedcure_app.flower.node_data import NodeData
    from fedcure_app.models import build_model, check_task_model, cycles_key, model_signature

    task = cfg.task
    if task is None:
        raise DataRefused("the run has no task: own data needs a cloud (or run config) with "
                          "a task")
    label_column = label_column or cfg.data.label_column
    holdout = cfg.data.holdout if holdout is None else holdout
    check_task_model(task)  # within bounds before any data is read
    part = read_client_data(data, task, label_column=label_column, holdout=holdout,
                            seed=cfg.run.seed)
    if len(part.y_train) == 0:
        raise DataRefused(f"{data}: no training samples left after the hold-out", "no-samples")
    signature = [[k, list(shape)] for k, shape in model_signature(build_model(task))]
    if task.kind == "image":  # uint8 pixels, normalised per batch by the trainer
        x, x_test = part.x_train, part.x_test
        norm: Any = tuple(tuple(float(v) for v in a) for a in pixel_norm(task))
    else:
        x, x_test, norm = normalise_x(part.x_train, task), normalise_x(part.x_test, task), None
    n, m = cfg.federation.num_clients, cfg.federation.num_edges
    counts = np.bincount(part.y_train, minlength=task.num_classes).astype(np.int64)
    reported = private_histogram(counts, epsilon if epsilon > 0 else math.inf, min_count)
    profiles = profiles_for(cfg)
    node = NodeData(x=x, y=part.y_train, dataset=cycles_key(task), num_classes=task.num_classes,
                    client_name=name, partition_id=index,
                    profile=profiles[min(index, len(profiles) - 1)], pixel_norm=norm,
                    x_test=x_test if len(part.y_test) else None,
                    y_test=part.y_test if len(part.y_test) else None,
                    task=task.model_dump(mode="json", by_alias=True))
    facts = {"samples": int(len(part.y_train)), "label_counts": reported.tolist(),
             "home": int(initial_edges(n, m)[min(index, n - 1)]),
             "profile": node.profile.model_dump(mode="json"), "model_signature": signature,
             "histogram_epsilon": float(epsilon) if epsilon > 0 else 0.0,
             "histogram_min_count": int(min_count),
             "held_out": int(len(part.y_test)), "source": part.source}
    return node, facts


def node_file_for_path(cfg: Any, data: str | Path, index: int) -> Path:
    """The node data file of ``data`` (Flower's ``data-path`` node config) under the run's
    task: built once into the cache folder, keyed by the path, its modification time, the task,
    the hold-out, the label column and the seed."""
    from fedcure_app.data.cache import cache_dirs
    from fedcure_app.flower.node_data import save_node_data

    if cfg.task is None:
        raise DataRefused("a node config's data-path needs a run config with a task (run "
                          "config key task: a task file or its JSON)")
    p = Path(data).expanduser().resolve()
    if not p.exists():
        from fedcure_app.data.errors import ClientDataError

        raise ClientDataError(f"data-path {p}: no such file or folder", "unreadable", 1)
    d = cfg.data
    key = json.dumps([str(p), os.stat(p).st_mtime_ns, cfg.task.model_dump_json(), d.holdout,
                      d.label_column, cfg.run.seed, index, cfg.federation.num_clients])
    digest = hashlib.blake2b(key.encode(), digest_size=12).hexdigest()
    out = cache_dirs()[0] / "nodes" / f"{digest}.npz"
    built = not out.is_file()
    if built:
        node, _ = own_node_data(cfg, p, index=index, name=f"node-{index}")
        save_node_data(out, node)
    if out not in _logged:  # once a process: this runs for every message
        _logged.add(out)
        _log_holding(cfg, out, index, built)
    return out


#: node data files whose holding this process has logged
_logged: set[Path] = set()


def _log_holding(cfg: Any, node_file: Path, index: int, built: bool) -> None:
    """One line of what node ``index`` trains on, label counts by class name, as
    ``fedcure-client`` logs it, on Flower's logger (the SuperNode's output; nothing of it is
    sent)."""
    import numpy as np
    from flwr.common import log

    from fedcure_app.trained.names import counts_text, holding_text, run_classes

    with np.load(node_file, allow_pickle=False) as z:
        y = z["y"]
        held_out = len(z["y_test"]) if "y_test" in z.files else 0
    counts = np.bincount(y, minlength=cfg.task.num_classes).tolist()
    log(INFO, "node %d: data-path holds %s (label counts %s, %d held out; %s %s)", index,
        holding_text(cfg, len(y)), counts_text(counts, run_classes(cfg)), held_out,
        "built into" if built else "cached in", node_file)


__all__ = ["DataRefused", "node_file_for_path", "own_node_data"]
