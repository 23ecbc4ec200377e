"""The data file of one deployed client: its training samples, device profile and identity.

``fedcure-client`` computes its partition once and writes it here; the SuperNode it starts gets
the file's path in its node config (``data-file``), and the ClientApp (a fresh process per
message) loads it instead of re-reading and re-partitioning the dataset.

Format: a NumPy ``.npz`` with arrays ``x`` (N×C×H×W: uint8 pixels as the dataset stores them,
normalised per batch by the trainer (:class:`fedcure_app.training.PixelNorm`), or float32
already normalised), ``y`` (int64, N), optionally ``x_test``/``y_test`` (own data: the held-out
part the client evaluates global models on, federated evaluation) and ``meta``
(a 0-d unicode array holding JSON: ``dataset``, ``num_classes``, ``client_name``,
``partition_id``, ``profile`` (a :class:`~fedcure_app.devices.DeviceProfile` as a dict),
``task`` (own data: the run's task as a dict, from which the trainer builds the model),
``format`` = ``"fedcure-node-data/1"`` and, with uint8 pixels, ``pixel_norm``: the per-channel
``scale`` and ``shift`` the trainer normalises them with, so that it need not import the dataset
readers).

Next to it, the ClientApp appends one JSON line per training message to
``<data-file>.applied.jsonl`` (:func:`append_applied`): the directive it received and the
frequency it ran at, so the client (and tests) can show that directives arrived and were applied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedcure_app.devices import DeviceProfile, parse_profile

if TYPE_CHECKING:
    import numpy as np

FORMAT = "fedcure-node-data/1"


class NodeDataError(ValueError):
    """A node data file that is missing or malformed (one line)."""


@dataclass(frozen=True)
class NodeData:
    """One client's samples, identity and device profile. ``x``: uint8 pixels (N, C, H, W) as
    the dataset stores them, or float32 images already normalised."""

    x: np.ndarray
    y: np.ndarray
    dataset: str
    num_classes: int
    client_name: str
    partition_id: int
    profile: DeviceProfile
    #: per-channel (scale, shift) that normalise uint8 ``x`` as x·scale − shift (float32 values,
    #: :func:`fedcure_app.data.dataset.norm_constants`); None: the dataset's, or ``x`` is float32
    pixel_norm: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    #: the client's held-out part for federated evaluation (same dtype and normalisation as
    #: ``x``), own data only; None: the client evaluates nothing
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    #: the run's task (:class:`fedcure_app.data.task.TaskConfig` as a JSON dict) when the
    #: client trains on its own data: the trainer builds the task's model from it
    task: dict[str, Any] | None = None

    @property
    def label_counts(self) -> np.ndarray:
        """Samples per class, (num_classes,) int64."""
        import numpy as np

        return np.bincount(self.y, minlength=self.num_classes).astype(np.int64)


def save_node_data(path: str | Path, data: NodeData) -> Path:
    """Write ``data`` atomically to ``path`` (an ``.npz``); return the path."""
    import numpy as np

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT, "dataset": data.dataset, "num_classes": int(data.num_classes),
        "client_name": data.client_name, "partition_id": int(data.partition_id),
        "profile": data.profile.model_dump(mode="json"),
    }
    if data.pixel_norm is not None:
        meta["pixel_norm"] = {"scale": [float(v) for v in data.pixel_norm[0]],
                              "shift": [float(v) for v in data.pixel_norm[1]]}
    if data.task is not None:
        meta["task"] = data.task
    tmp = p.with_name(p.name + ".tmp.npz")
    x_dtype = np.uint8 if data.x.dtype == np.uint8 else np.float32
    arrays = {"x": np.ascontiguousarray(data.x, dtype=x_dtype),
              "y": np.ascontiguousarray(data.y, dtype=np.int64)}
    if data.x_test is not None and data.y_test is not None:
        arrays["x_test"] = np.ascontiguousarray(data.x_test, dtype=x_dtype)
        arrays["y_test"] = np.ascontiguousarray(data.y_test, dtype=np.int64)
    np.savez(tmp, **arrays, meta=np.array(json.dumps(meta)))
    os.replace(tmp, p)
    return p


def load_node_data(path: str | Path) -> NodeData:
    """Read a node data file; :class:`NodeDataError` when missing or malformed."""
    import numpy as np

    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            x, y, meta_raw = z["x"], z["y"], str(z["meta"])
            x_test = z["x_test"] if "x_test" in z.files else None
            y_test = z["y_test"] if "y_test" in z.files else None
    except FileNotFoundError:
        raise NodeDataError(f"node data file {p} not found") from None
    except (OSError, KeyError, ValueError) as err:
        raise NodeDataError(f"node data file {p} is not readable: {err}") from None
    try:
        meta: dict[str, Any] = json.loads(meta_raw)
        if meta.get("format") != FORMAT:
            raise NodeDataError(f"node data file {p}: format {meta.get('format')!r}, "
                                f"expected {FORMAT!r}")
        profile = parse_profile(meta["profile"])
        norm = meta.get("pixel_norm")
        out = NodeData(x=x, y=y, dataset=str(meta["dataset"]),
                       num_classes=int(meta["num_classes"]),
                       client_name=str(meta["client_name"]),
                       partition_id=int(meta["partition_id"]), profile=profile,
                       pixel_norm=None if norm is None else (
                           tuple(float(v) for v in norm["scale"]),
                           tuple(float(v) for v in norm["shift"])),
                       x_test=x_test, y_test=y_test, task=meta.get("task"))
    except NodeDataError:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise NodeDataError(f"node data file {p}: bad metadata ({err})") from None
    if out.x.shape[0] != out.y.shape[0] or out.y.size == 0:
        raise NodeDataError(f"node data file {p}: {out.x.shape[0]} inputs for {out.y.size} "
                            "labels (needs at least one sample)")
    if out.x.dtype not in (np.uint8, np.float32):
        raise NodeDataError(f"node data file {p}: images are {out.x.dtype}, expected uint8 "
                            "pixels or normalised float32")
    return out


def applied_path(data_file: str | Path) -> Path:
    """Where the ClientApp logs the directives it applied (next to the data file)."""
    p = Path(data_file)
    return p.with_name(p.name + ".applied.jsonl")


def append_applied(data_file: str | Path, entry: dict[str, Any]) -> None:
    """Append one JSON line (a directive and what was applied) to :func:`applied_path`."""
    with open(applied_path(data_file), "a") as f:
        f.write(json.dumps(entry) + "\n")


def read_applied(data_file: str | Path) -> list[dict[str, Any]]:
    """The entries :func:`append_applied` wrote (empty when none)."""
    p = applied_path(data_file)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


__all__ = ["FORMAT", "NodeData", "NodeDataError", "append_applied", "applied_path",
           "load_node_data", "read_applied", "save_node_data"]
