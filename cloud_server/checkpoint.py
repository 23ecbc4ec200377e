"""Durable cloud state: atomic checkpoints the cloud resumes from after a crash (SIGKILL), a
write cut short, a damaged file or a full disk.

Layout of a checkpoint folder (``<out>/checkpoint`` by default)::

    state.json                   the newest generation's state (everything but the models)
    state.copy.json              the same generation, a second copy
    state.prev.json              the previous generation
    model-v<V>.safetensors       the global model of version V (codec format), written once
    model-v<V>.copy.safetensors  its second copy

Each save is one *generation* (numbered 1, 2, ...). Its state names the model files it needs (the
global version and the base versions of the tasks in flight) with their SHA-256 and carries the
SHA-256 of its own body, so a torn or damaged file is told from a whole one. Every file is written
to a temp file, fsynced, ``os.replace``d and its folder fsynced; the models before the state that
names them, the state's first copy (after the previous first copy became ``state.prev.json``,
by a hard link, so that ``state.json`` is never missing: :func:`keep_as_previous`) before its
second. Files no kept state names are removed afterwards.

:meth:`CheckpointStore.load` takes the newest generation whose state and models check out,
each file from whichever copy is whole, and repairs the damaged copy; when it had to pass over a
damaged file it says so in :attr:`CheckpointStore.recovered` (one line). So one torn or damaged
file loses nothing, and a generation whose two state copies are both damaged (a write cut short
before the second copy) falls back to the previous generation.

The cloud writes a checkpoint after formation, after every accepted update *before* it answers
the Submit (an ``accepted=True`` reply means the update is on disk), and after every change of
coalition availability. A save that finds the disk full raises :class:`DiskFull` and leaves the
previous generation whole. ``CloudController.to_state``/``from_state`` (``cloud_server.controller``,
with the ``cloud_server.state`` dataclasses) build and read the state; this module only stores
it and knows nothing of the cloud.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

FORMAT = "fedcure-cloud-checkpoint/2"
#: the single-file format before generations and copies (read, without a state checksum)
OLD_FORMAT = "fedcure-cloud-checkpoint/1"
STATE = "state.json"
COPY = "state.copy.json"
PREV = "state.prev.json"
#: the state files, newest first
STATE_FILES = (STATE, COPY, PREV)
#: configuration keys that may change between a run and its resumption
MUTABLE_KEYS = {("run", "global_rounds"), ("run", "eval_every"), ("data", "data_dir")}
#: errno values that mean "no space left" (a full disk, a full quota)
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit this run (one-line message)."""


class DiskFull(OSError):
    """A checkpoint not written for want of space; the previous generation is whole."""


def model_name(version: int, copy: bool = False) -> str:
    """The file name of the global model of ``version`` (``copy``: its second copy)."""
    return f"model-v{int(version)}{'.copy' if copy else ''}.safetensors"


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
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, os.replace;
    a failed write removes its temp file (a full disk keeps no half file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        _fsync_dir(path.parent)


def _digest_of(body: dict[str, Any]) -> tuple[str, bytes]:
    """The SHA-256 of a state body and the body with it, as the bytes written."""
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    digest = hashlib.sha256(canon).hexdigest()
    # the checksum goes last (the reader drops it and re-sorts): no second encoding of the body
    return digest, canon[:-1] + (b"," if body else b"") + f'"sha256":"{digest}"}}'.encode()


def read_state(path: Path) -> dict[str, Any]:
    """One state file, checked whole (:class:`CheckpointError` naming what is wrong)."""
    try:
        state = json.loads(path.read_bytes())
    except OSError as err:
        raise CheckpointError(f"{path.name} cannot be read ({err.strerror})") from None
    except ValueError:
        raise CheckpointError(f"{path.name} is torn (not whole JSON)") from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, OLD_FORMAT):
        raise CheckpointError(f"{path.name} is not a {FORMAT} checkpoint")
    if state["format"] == FORMAT:
        digest = state.pop("sha256", None)
        if not isinstance(digest, str) or _digest_of(state)[0] != digest:
            raise CheckpointError(f"{path.name} is damaged (SHA-256 mismatch)")
    return state


def keep_as_previous(state: Path, prev: Path) -> None:
    """Make ``prev`` the generation ``state`` holds now, while ``state`` stays in place until
    the next generation replaces it atomically (a reader, or a crash, never finds no
    ``state.json``): a hard link put in place with ``os.replace`` (a copy where the file system
    has no hard links)."""
    tmp = prev.with_name(f".{prev.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(state, tmp)
    except FileNotFoundError:
        raise
    except OSError:  # no hard links here: copy the bytes
        tmp.write_bytes(state.read_bytes())
    os.replace(tmp, prev)


class CheckpointStore:
    """One checkpoint folder: :meth:`save` and :meth:`load` (see the module docstring).

    Parameters
    ----------
    directory:
        The folder (made on the first save).
    sync:
        fsync every file and the folder (off only in tests that time nothing durable).
    """

    def __init__(self, directory: str | Path, *, sync: bool = True) -> None:
        self.dir = Path(directory)
        self.sync = sync
        self.writes = 0
        self.seconds = 0.0
        #: what :meth:`load` passed over to find a whole generation (one line), or None
        self.recovered: str | None = None
        #: the newest generation on disk (None: this run has neither loaded nor saved yet)
        self._generation: int | None = None
        #: ``state.json`` holds a whole generation (it may become ``state.prev.json``)
        self._primary_ok = False
        #: model versions each state file on disk names
        self._refs: dict[str, set[int]] = {}
        #: model files known whole on disk: name -> SHA-256
        self._written: dict[str, str] = {}

    @property
    def state_path(self) -> Path:
        """The newest generation's state file (JSON; first copy)."""
        return self.dir / STATE

    def exists(self) -> bool:
        """Whether any state is on disk (a run to resume)."""
        return any((self.dir / name).is_file() for name in STATE_FILES)

    def save(self, state: dict[str, Any], models: dict[int, bytes | memoryview]) -> None:
        """Write the model files not on disk yet, then a new generation's state, then prune.
        :class:`DiskFull` when the disk has no space (the previous generation stays whole)."""
        try:
            self._save(state, models)
        except OSError as err:
            if err.errno in NO_SPACE:
                raise DiskFull(err.errno, f"no space left in {self.dir} for a checkpoint "
                                          f"({err.strerror})") from err
            raise

    def _save(self, state: dict[str, Any], models: dict[int, bytes | memoryview]) -> None:
        t = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._generation is None:  # a fresh run: nothing of an older run may be loaded
            for p in [*self.dir.glob("state*.json"), *self.dir.glob("model-v*.safetensors")]:
                p.unlink(missing_ok=True)
            self._generation = 0
        digests: dict[str, str] = {}
        for version, blob in sorted(models.items()):
            digest = hashlib.sha256(blob).hexdigest()
            digests[str(version)] = digest
            for copy in (False, True):
                name = model_name(version, copy)
                if self._written.get(name) != digest:
                    write_atomic(self.dir / name, blob, sync=self.sync)
                    self._written[name] = digest
        self._generation += 1
        _, data = _digest_of(dict(state, format=FORMAT, generation=self._generation,
                                  models=digests, saved_at=time.time()))
        if self._primary_ok:
            try:
                keep_as_previous(self.dir / STATE, self.dir / PREV)
                self._refs[PREV] = set(self._refs.get(STATE, set()))
            except FileNotFoundError:  # removed behind the store's back: the copy stays
                pass
        versions = {int(v) for v in digests}
        write_atomic(self.dir / STATE, data, sync=self.sync)
        self._refs[STATE], self._primary_ok = versions, True
        write_atomic(self.dir / COPY, data, sync=self.sync)
        self._refs[COPY] = versions
        self._prune()
        self.writes += 1
        self.seconds += time.perf_counter() - t

    def _prune(self) -> None:
        """Remove model files no kept state names, and temp files."""
        keep = {model_name(v, c) for vs in self._refs.values() for v in vs for c in (False, True)}
        for p in self.dir.glob("model-v*.safetensors"):
            if p.name not in keep:
                p.unlink(missing_ok=True)
                self._written.pop(p.name, None)
        for p in self.dir.glob(".*.tmp"):
            p.unlink(missing_ok=True)

    def load(self) -> tuple[dict[str, Any], dict[int, bytes]]:
        """The newest whole generation's state and its model bytes per version (see the module
        docstring); :class:`CheckpointError` when no generation is whole."""
        problems: list[str] = []
        found: list[tuple[int, str, dict[str, Any]]] = []
        for name in STATE_FILES:
            if not (self.dir / name).exists():
                continue
            try:
                state = read_state(self.dir / name)
            except CheckpointError as err:
                problems.append(str(err))
                continue
            found.append((int(state.get("generation", 0)), name, state))
        self._refs = {name: {int(v) for v in st.get("models", {})} for _, name, st in found}
        self._generation = max((g for g, _, _ in found), default=0)
        for generation, name, state in sorted(found, key=lambda x: -x[0]):
            models = self._models(state, problems)
            if models is None:
                continue
            self._adopt(name, state)
            self.recovered = None if not problems else (
                f"checkpoint {self.dir}: " + "; ".join(problems)
                + f"; loaded generation {generation} from {name}")
            return state, models
        raise CheckpointError(f"no whole checkpoint in {self.dir}: "
                              + ("; ".join(problems) or "no state file"))

    def _models(self, state: dict[str, Any], problems: list[str]) -> dict[int, bytes] | None:
        """The models ``state`` names, each from a whole copy (the other repaired), or None
        (``problems`` says why)."""
        models: dict[int, bytes] = {}
        for v, digest in state.get("models", {}).items():
            blobs = {}
            for copy in (False, True):
                try:
                    blobs[copy] = (self.dir / model_name(int(v), copy)).read_bytes()
                except OSError:
                    blobs[copy] = None
            good = [c for c, b in blobs.items()
                    if b is not None and hashlib.sha256(b).hexdigest() == digest]
            if not good:
                problems.append(f"{model_name(int(v))} (generation {state.get('generation', 0)}) "
                                + ("is damaged (SHA-256 mismatch)" if any(blobs.values())
                                   else "is missing") + " in both copies")
                return None
            blob = blobs[good[0]]
            assert blob is not None
            for copy in (False, True):
                if copy not in good:
                    problems.append(f"{model_name(int(v), copy)} was "
                                    + ("damaged" if blobs[copy] is not None else "missing")
                                    + " (repaired from its copy)")
                    self._repair(self.dir / model_name(int(v), copy), blob)
                self._written[model_name(int(v), copy)] = digest
            models[int(v)] = blob
        return models

    def _adopt(self, name: str, state: dict[str, Any]) -> None:
        """After loading ``state`` from file ``name``: it becomes ``state.json`` again if it was
        read elsewhere, so the next save keeps it as the previous generation."""
        repaired = name != STATE and self._repair(self.dir / STATE, _digest_of(state)[1])
        if repaired:
            self._refs[STATE] = set(self._refs.get(name, set()))
        self._primary_ok = name == STATE or repaired

    def _repair(self, path: Path, data: bytes) -> bool:
        """Rewrite a damaged copy; False when that fails (e.g. the disk is full)."""
        try:
            write_atomic(path, data, sync=self.sync)
            return True
        except OSError:
            return False


# ------------------------------------------------------------------------------ compatibility
def config_diff(saved: dict[str, Any], current: dict[str, Any],
                defaults: dict[str, Any] | None = None) -> list[str]:
    """``section.key: old -> new`` for every setting a resumed run may not change. A setting
    the checkpoint lacks (written before the setting existed) passes at its default
    (``defaults``: the schema's defaults, same layout)."""
    out = []
    for section, fields in current.items():
        if not isinstance(fields, dict):
            continue
        had = saved.get(section)
        had = had if isinstance(had, dict) else {}
        for name, value in fields.items():
            if (section, name) in MUTABLE_KEYS:
                continue
            if name not in had and defaults is not None and (
                    defaults.get(section) or {}).get(name) == value:
                continue
            old = had.get(name)
            if old != value:
                out.append(f"{section}.{name}: {old!r} -> {value!r}")
    return out


__all__ = ["CheckpointError", "CheckpointStore", "DiskFull", "FORMAT", "config_diff", "model_name",
           "read_state", "write_atomic"]
