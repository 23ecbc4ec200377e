"""Durable cloud state: atomic checkpoints the cloud resumes from after a crash (SIGKILL).

Layout of a checkpoint folder (``<out>/checkpoint`` by default)::

    state.json              everything but the models; replaced atomically (the commit point)
    model-v<V>.safetensors  the global model of version V (codec format), written once, atomically

``state.json`` names the model files it needs (the global version and the base versions of the
tasks in flight) with their SHA-256. A model file is always written (temp file, fsync,
``os.replace``, fsync of the folder) before the ``state.json`` that refers to it, and files no
state refers to are removed afterwards, so a crash at any point leaves the previous or the new
checkpoint whole.

The cloud writes a checkpoint after formation, after every accepted update *before* it answers
the Submit (an ``accepted=True`` reply means the update is on disk), and after every change of
coalition availability. ``CloudController.to_state``/``from_state`` (``cloud_server.controller``,
with the ``cloud_server.state`` dataclasses) build and read the state; this module only stores
it and knows nothing of the cloud.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

FORMAT = "fedcure-cloud-checkpoint/1"
STATE = "state.json"
#: configuration keys that may change between a run and its resumption
MUTABLE_KEYS = {("run", "global_rounds"), ("run", "eval_every"), ("data", "data_dir")}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit this run (one-line message)."""


def model_name(version: int) -> str:
    return f"model-v{int(version)}.safetensors"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | memoryview, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, os.replace."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path.parent)


class CheckpointStore:
    """One checkpoint folder: :meth:`save` and :meth:`load` (see the module docstring)."""

    def __init__(self, directory: str | Path, *, sync: bool = True) -> None:
        self.dir = Path(directory)
        self.sync = sync
        self.writes = 0
        self.seconds = 0.0

    @property
    def state_path(self) -> Path:
        """The committed state file (JSON) of this checkpoint folder."""
        return self.dir / STATE

    def exists(self) -> bool:
        """Whether a committed state is on disk (a run to resume)."""
        return self.state_path.is_file()

    def save(self, state: dict[str, Any], models: dict[int, bytes | memoryview]) -> None:
        """Write the model files ``state`` lacks on disk, then ``state.json``, then prune."""
        t = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        digests: dict[str, str] = {}
        for version, blob in sorted(models.items()):
            path = self.dir / model_name(version)
            digest = hashlib.sha256(blob).hexdigest()
            digests[str(version)] = digest
            if not path.exists():
                write_atomic(path, blob, sync=self.sync)
        state = dict(state, format=FORMAT, models=digests, saved_at=time.time())
        write_atomic(self.state_path, json.dumps(state, allow_nan=False).encode(), sync=self.sync)
        keep = {model_name(int(v)) for v in digests}
        for p in self.dir.glob("model-v*.safetensors"):
            if p.name not in keep:
                p.unlink(missing_ok=True)
        for p in self.dir.glob(".*.tmp"):
            p.unlink(missing_ok=True)
        self.writes += 1
        self.seconds += time.perf_counter() - t

    def load(self) -> tuple[dict[str, Any], dict[int, bytes]]:
        """The state and the model bytes per version; :class:`CheckpointError` if damaged."""
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"cannot read checkpoint {self.state_path}: {err}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(f"{self.state_path} is not a {FORMAT} checkpoint")
        models: dict[int, bytes] = {}
        for v, digest in state["models"].items():
            path = self.dir / model_name(int(v))
            try:
                blob = path.read_bytes()
            except OSError as err:
                raise CheckpointError(f"checkpoint model {path} is missing: {err}") from None
            if hashlib.sha256(blob).hexdigest() != digest:
                raise CheckpointError(f"checkpoint model {path} is damaged (SHA-256 mismatch)")
            models[int(v)] = blob
        return state, models


# ------------------------------------------------------------------------------ compatibility
def config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``section.key: old -> new`` for every setting a resumed run may not change."""
    out = []
    for section, fields in current.items():
        if not isinstance(fields, dict):
            continue
        for name, value in fields.items():
            if (section, name) in MUTABLE_KEYS:
                continue
            old = saved.get(section, {}).get(name)
            if old != value:
                out.append(f"{section}.{name}: {old!r} -> {value!r}")
    return out


__all__ = ["CheckpointError", "CheckpointStore", "FORMAT", "config_diff", "model_name", "write_atomic"]
