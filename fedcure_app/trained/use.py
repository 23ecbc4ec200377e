"""A run's trained model used on a user's data (``fedcure model evaluate|predict``): the run
folder loaded (:func:`load_run`), its model evaluated on data in any format a client reads
(:func:`evaluate_data`, all of it test data, the same refusals as a client's, naming the
file), or asked for the classes of image files or CSV rows (:func:`predict_files`).

The model is the run's ``model.pt`` in the task's model behind the task's normalisation
(:class:`~fedcure_app.trained.exporting.NormalisedModel`), fed what ``model.pt2`` takes:
pixels / 255 as float32 for images, raw features for tables.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from fedcure_app.data.errors import ClientDataError
from fedcure_app.data.task import TaskConfig
from fedcure_app.trained.exporting import NormalisedModel
from fedcure_app.trained.files import (
    MODEL_INFO, MODEL_PT, ModelFileError, load_weights, read_task)

#: samples per forward pass
BATCH = 512


@dataclass(frozen=True, eq=False)
class RunModel:
    """A run folder's model: its task, the model (eval mode, normalisation inside), what
    ``model.json`` and ``result.json`` say (empty when absent)."""

    folder: Path
    task: TaskConfig
    module: NormalisedModel
    info: dict[str, Any]
    result: dict[str, Any]

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.module.model.parameters())


def _json(path: Path) -> dict[str, Any]:
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def _where_the_model_is(d: Path) -> str:
    """The hint of a refusal for a folder without a model: a ``flwr run`` out-dir (its
    ``latest`` pointer names the run folder that holds one) or what writes one."""
    try:
        rid = (d / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError):
        rid = ""
    if rid.isalnum() and (d / rid / MODEL_PT).is_file():
        return f"flwr run keeps each run in a folder of its own: the latest is {d / rid}"
    return ("a finished run of fedcure simulate, launch, testbed, fedcure-cloud or flwr run "
            "writes one")


def load_run(folder: str | Path) -> RunModel:
    """The model of the run in ``folder``; :class:`ModelFileError` in one line for a folder
    without ``model.pt`` or a model that does not fit the folder's task."""
    from fedcure_app.models import build_task_model, set_weights

    d = Path(folder)
    if not d.is_dir():
        raise ModelFileError(f"{d}: no such run folder")
    if not (d / MODEL_PT).is_file():
        raise ModelFileError(f"{d}: no {MODEL_PT} in this folder ({_where_the_model_is(d)})")
    task = read_task(d)
    model = build_task_model(task)
    set_weights(model, load_weights(d / MODEL_PT, task))
    module = NormalisedModel(model, task).eval()
    return RunModel(d, task, module, _json(d / MODEL_INFO), _json(d / "result.json"))


def model_input(x: np.ndarray, task: TaskConfig) -> np.ndarray:
    """What the exported model takes: uint8 pixels as float32 in [0, 1], features as they are."""
    out = np.asarray(x, dtype=np.float32)
    return out / np.float32(255.0) if task.kind == "image" else out


def logits(run: RunModel, x: np.ndarray) -> torch.Tensor:
    """The model's logits for model inputs ``x`` (:func:`model_input`), in batches."""
    xt = torch.from_numpy(np.ascontiguousarray(x))
    if not len(xt):
        return torch.zeros((0, run.task.num_classes))
    with torch.inference_mode():
        return torch.cat([run.module(xt[i:i + BATCH]) for i in range(0, len(xt), BATCH)])


def evaluate_data(run: RunModel, path: str | Path, label_column: str = "label"
                  ) -> dict[str, Any]:
    """Accuracy, loss (mean cross-entropy, nats), per class accuracy and support by class
    name, and the confusion counts ``[true][predicted]`` of the model on all of ``path``."""
    from fedcure_app.data.own import read_test_data

    part = read_test_data(path, run.task, label_column=label_column)
    x, y = part.x_test, part.y_test
    out = logits(run, model_input(x, run.task))
    yt = torch.from_numpy(y)
    pred = out.argmax(dim=1).numpy()
    k = run.task.num_classes
    conf = np.zeros((k, k), dtype=np.int64)
    np.add.at(conf, (y, pred), 1)
    support = conf.sum(axis=1)
    classes = [{"name": name, "support": int(support[i]),
                "accuracy": float(conf[i, i] / support[i]) if support[i] else None}
               for i, name in enumerate(run.task.classes)]
    return {"data": part.source, "samples": int(len(y)),
            "accuracy": float((pred == y).mean()),
            "loss": float(F.cross_entropy(out, yt).item()),
            "classes": classes, "confusion": conf.tolist()}


def _feature_rows(path: Path, label_column: str, features: int) -> np.ndarray:
    """A CSV's rows as float32 (N, F), the label column (if any) left out."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ClientDataError(f"{path}: cannot read CSV ({type(err).__name__})") from None
    if len(rows) < 2:
        raise ClientDataError(f"{path}: no data rows under the header")
    head = [h.strip() for h in rows[0]]
    keep = [i for i, h in enumerate(head) if h != label_column]
    if len(keep) != features:
        raise ClientDataError(f"{path}: {len(keep)} feature columns, the task has features = "
                              f"{features}")
    out = np.zeros((len(rows) - 1, features), dtype=np.float32)
    for r, cells in enumerate(rows[1:], start=1):
        for j, i in enumerate(keep):
            try:
                out[r - 1, j] = float(cells[i])
            except (ValueError, IndexError):
                raise ClientDataError(f"{path}: row {r}, column {head[i]!r}: not a number"
                                      ) from None
    return out


def inputs_of(run: RunModel, files: list[str | Path], label_column: str = "label"
              ) -> list[tuple[str, np.ndarray]]:
    """(name, model input) per image file or CSV row of ``files`` (existing files:
    :func:`expand_inputs`), refused in one line naming the file when it does not fit the
    task."""
    from fedcure_app.data.own_images import decode_files

    task = run.task
    out: list[tuple[str, np.ndarray]] = []
    for f in map(Path, files):
        if task.kind == "tabular":
            if f.suffix.lower() != ".csv":
                raise ClientDataError(f"{f}: not a .csv file, the task's kind is tabular")
            rows = _feature_rows(f, label_column, int(task.features or 0))
            out += [(f"{f}:{i + 1}", row) for i, row in enumerate(model_input(rows, task))]
        else:
            x = decode_files([f], task.sample_shape, task.resize)
            out.append((str(f), model_input(x, task)[0]))
    return out


#: files whose inputs :func:`predict_files` holds in memory at once
PREDICT_CHUNK = 256


def expand_inputs(run: RunModel, paths: list[str | Path]) -> list[Path]:
    """``paths`` with each folder replaced by the files in it (and its subfolders, sorted,
    hidden ones left out) that the task reads: images, or ``.csv`` files for a tabular task.
    A path that does not exist, or a folder holding none of them, is refused in one line
    naming it; a file is kept as given (:func:`inputs_of` refuses it if it does not fit)."""
    from fedcure_app.data.own_images import IMAGE_SUFFIXES

    wanted = (".csv",) if run.task.kind == "tabular" else IMAGE_SUFFIXES
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
            continue
        if not p.is_dir():
            raise ClientDataError(f"{p}: no such file")
        found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in wanted
                       and not any(part.startswith(".") for part in f.relative_to(p).parts))
        if not found:
            raise ClientDataError(f"{p}: a folder with no {'/'.join(w[1:] for w in wanted)} "
                                  "files in it")
        out += found
    return out


def predict_files(run: RunModel, files: list[str | Path], top: int = 1,
                  label_column: str = "label") -> Iterator[dict[str, Any]]:
    """Per input, in order: its name and the ``top`` classes with their probabilities
    (softmax). A folder stands for the files in it (:func:`expand_inputs`); every path is
    checked before the first prediction, and at most :data:`PREDICT_CHUNK` files' inputs are
    held at once (a file that does not fit is refused when its chunk is read)."""
    paths = expand_inputs(run, files)
    return _predictions(run, paths, max(1, min(top, run.task.num_classes)), label_column)


def _predictions(run: RunModel, paths: list[Path], k: int, label_column: str
                 ) -> Iterator[dict[str, Any]]:
    for start in range(0, len(paths), PREDICT_CHUNK):
        got = inputs_of(run, paths[start:start + PREDICT_CHUNK], label_column)
        if not got:
            continue
        probs = torch.softmax(logits(run, np.stack([x for _, x in got])), dim=1)
        values, index = probs.topk(k, dim=1)
        for n, (name, _) in enumerate(got):
            yield {"input": name, "top": [{"class": run.task.classes[int(i)],
                                           "probability": float(p)}
                                          for p, i in zip(values[n], index[n])]}


def plot_confusion(report: dict[str, Any], path: str | Path) -> Path:
    """The confusion matrix of :func:`evaluate_data` as a PNG (rows: true class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = np.asarray(report["confusion"])
    names = [c["name"] for c in report["classes"]]
    side = max(4.0, 0.45 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(side, side))
    ax.imshow(conf, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=90)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if len(names) <= 30:
        for (i, j), v in np.ndenumerate(conf):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
    ax.set_title(f"accuracy {100 * report['accuracy']:.2f} % on {report['samples']} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


__all__ = ["PREDICT_CHUNK", "RunModel", "evaluate_data", "expand_inputs", "inputs_of",
           "load_run", "logits", "model_input", "plot_confusion", "predict_files"]
