"""A federation over the clients' own data (``--task`` with ``--clients-data DIR``).

``DIR`` holds one entry per client (a folder of class folders, an ``.npz``, a ``.csv`` or a
``datasets.save_to_disk`` folder), taken in sorted name order: client i is entry i and trains on
nothing else. No partition is cut: the partition is who holds what. The simulation concatenates
the clients' training parts (``Dataset.client_indices`` says whose is whose) and evaluates on
the union of their held-out parts, which is exactly the sample-weighted mean of every client
evaluating the model on its own held-out part (federated evaluation). Each client's hold-out is
drawn with the run's seed, as a deployed client reading the same entry draws it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.data.dataset import Dataset
from fedcure_app.data.errors import CorruptDatasetError, DatasetError, MissingDatasetError

log = logging.getLogger(__name__)

def initial_edges(num_clients: int, num_edges: int) -> np.ndarray:
    """Each client's initial ES when the clients bring their own data: contiguous blocks in
    client (name) order, client i on ES ⌊i·M/N⌋, so every ES gets ⌊N/M⌋ or ⌈N/M⌉ clients."""
    return (np.arange(num_clients, dtype=np.int64) * num_edges) // max(1, num_clients)


def load_own_dataset(task: Any, clients_dir: str | Path, *, holdout: float, seed: int,
                     label_column: str = "label", test_data: str | Path | None = None
                     ) -> Dataset:
    """Every client entry of ``clients_dir`` read under ``task``, as one :class:`Dataset`
    (normalised float32) whose ``client_indices`` give each client its own samples and whose
    test split is the union of the clients' held-out parts, or all of ``test_data`` (a central
    test set, ``Dataset.test_source``)."""
    from fedcure_app.data.names import client_name
    from fedcure_app.data.own import (
        client_entries, normalise_x, read_client_data, read_test_data)

    parts, names, withdrawn = [], [], {}
    for entry in client_entries(clients_dir):
        try:
            part = read_client_data(entry, task, label_column=label_column, holdout=holdout,
                                    seed=seed)
            if len(part.y_train) == 0:
                raise CorruptDatasetError(f"{entry}: no training samples left after the "
                                          "hold-out")
        except DatasetError as err:  # refused as a deployed client is: the others go on
            withdrawn[client_name(entry)] = refused(client_name(entry), err)
            continue
        parts.append(part)
        names.append(client_name(entry))
    if not parts:
        raise CorruptDatasetError(f"clients-data {clients_dir}: every client was refused "
                                  f"({', '.join(withdrawn)})")
    sizes = np.array([len(p.y_train) for p in parts], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    x_train = normalise_x(np.concatenate([p.x_train for p in parts]), task)
    y_train = np.concatenate([p.y_train for p in parts]).astype(np.int64)
    tests = [p for p in parts if len(p.y_test)]
    if test_data is not None:
        tests = [read_test_data(test_data, task, label_column=label_column)]
    elif not tests:
        raise CorruptDatasetError(f"clients-data {clients_dir}: no client has a held-out part "
                                  "to evaluate on (set holdout > 0, or give test/ folders)")
    x_test = normalise_x(np.concatenate([p.x_test for p in tests]), task)
    y_test = np.concatenate([p.y_test for p in tests]).astype(np.int64)
    log.info("own data: %d clients, %d training samples from %s; %d test samples (%s)",
             len(parts), int(sizes.sum()), clients_dir, len(y_test),
             test_data if test_data is not None else "the clients' held-out parts")
    return Dataset(
        name="task", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        num_classes=task.num_classes, input_shape=tuple(task.sample_shape),  # type: ignore
        class_names=tuple(task.classes), source=f"{len(parts)} clients in {clients_dir}",
        mean=task.mean_values, std=task.std_values, task=task,
        client_indices=[np.arange(starts[i], starts[i + 1], dtype=np.int64)
                        for i in range(len(parts))],
        client_names=tuple(names), withdrawn=withdrawn,
        test_source=str(test_data) if test_data is not None else "")


def refused(name: str, err: Exception) -> str:
    """Log ``NAME refused: WHY`` once (a warning, as ``fedcure launch`` says it of a client
    process) and return WHY on one line."""
    why = " ".join(str(err).split())
    log.warning("%s refused: %s", name, why)
    return why


def fitted_config(cfg: Any, dataset: Dataset) -> Any:
    """``cfg`` with one client per client ``dataset`` holds: fewer than the clients folder's
    entries when some were refused (``dataset.withdrawn``). :class:`CorruptDatasetError`
    when fewer clients than edges are left: the run cannot go on."""
    if dataset.client_indices is None or len(dataset.client_indices) == \
            cfg.federation.num_clients:
        return cfg
    from fedcure_app.config import apply_flat

    left, edges = len(dataset.client_indices), cfg.federation.num_edges
    if left < edges:
        raise CorruptDatasetError(
            f"{left} of {left + len(dataset.withdrawn)} clients left after refusals "
            f"({', '.join(dataset.withdrawn)}), fewer than the {edges} edges: every edge "
            "server needs at least one client")
    return apply_flat(cfg, {"num-clients": left})


def given_partition(dataset: Dataset, num_edges: int, seed: int) -> Any:
    """The :class:`~fedcure_app.data.partition.Partition` of a dataset whose clients brought
    their own data (``dataset.client_indices``), with :func:`initial_edges`."""
    from fedcure_app.data.partition import Partition

    idx = dataset.client_indices or []
    counts = np.stack([np.bincount(dataset.y_train[ix], minlength=dataset.num_classes)
                       for ix in idx]).astype(np.int64)
    return Partition(scheme="own", client_indices=list(idx), label_counts=counts,
                     initial_assignment=initial_edges(len(idx), num_edges),
                     num_edges=num_edges, seed=seed)


def with_task(cfg: Any, task: Any) -> Any:
    """``cfg`` running ``task`` (a :class:`~fedcure_app.data.task.TaskConfig`): its classes,
    and with ``data.clients-data`` one client per entry (Flower's run config names the task
    and the folder; the client count follows the folder)."""
    from fedcure_app.config import build_config
    from fedcure_app.data.own import client_entries

    data = cfg.model_dump()
    data["task"] = task.model_dump()
    data["federation"]["num_classes"] = task.num_classes
    if cfg.data.clients_data:
        n = len(client_entries(cfg.data.clients_data))
        if n != cfg.federation.num_clients:
            log.info("clients-data %s holds %d clients (num-clients %d ignored)",
                     cfg.data.clients_data, n, cfg.federation.num_clients)
        data["federation"]["num_clients"] = n
        data["federation"]["num_edges"] = min(cfg.federation.num_edges, n)
    return build_config(data)


def load_federation_data(cfg: Any) -> Dataset:
    """The data of a run: the clients' own (``cfg.task`` with ``data.clients_data``) or the
    built-in dataset ``data.dataset``."""
    if cfg.task is None:
        from fedcure_app.data.loader import load_dataset

        return load_dataset(cfg.data.dataset, cfg.data.data_dir)
    if not cfg.data.clients_data:
        raise MissingDatasetError("a task needs clients-data: the folder holding each "
                                  "client's data")
    return load_own_dataset(cfg.task, cfg.data.clients_data, holdout=cfg.data.holdout,
                            seed=cfg.run.seed, label_column=cfg.data.label_column)


__all__ = ["fitted_config", "given_partition", "refused", "initial_edges", "load_federation_data",
           "load_own_dataset", "with_task"]
