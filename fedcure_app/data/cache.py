"""On-disk cache of decoded uint8 splits (``.npz``), so a second load skips decoding.

Where: ``$FEDCURE_CACHE_DIR`` when set, else the user cache, ``$XDG_CACHE_HOME/fedcure`` or
``~/.cache/fedcure``. Never inside the data folder: that folder is the user's (it may be
read-only, or shared), and loading a dataset writes nothing under it.

Entry names are ``<dataset>-<hash of the absolute source dir>-<hash of the source files' names,
sizes and mtimes>.npz``: changing any source file changes the name, so a stale entry is never
read, and it is deleted when the fresh one is written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcure_app.data.dataset import RawSplits

log = logging.getLogger(__name__)

#: Bump when the cached arrays' layout changes.
FORMAT_VERSION = 1
_KEYS = ("x_train", "y_train", "x_test", "y_test")


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedcure``, else ``~/.cache/fedcure``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "fedcure"


def cache_dirs(_source: Path | None = None) -> list[Path]:
    """Directories to use for a source's cache, most preferred first (one today; never the
    source's own folder)."""
    override = os.environ.get("FEDCURE_CACHE_DIR")
    return [Path(override).expanduser() if override else user_cache_dir()]


def _digest(text: str, n: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()[:n]


@dataclass(frozen=True)
class CacheKey:
    """Identifies one decoded state of one source directory."""

    name: str
    source: Path
    digest: str

    @property
    def prefix(self) -> str:
        """Common to every state of this source: ``<dataset>-<source hash>``."""
        return f"{self.name}-{_digest(str(self.source), 10)}"

    @property
    def filename(self) -> str:
        return f"{self.prefix}-{self.digest}.npz"


def make_key(name: str, source: Path, files: list[Path]) -> CacheKey:
    """Key over the absolute source path and each file's relative name, size and mtime (ns)."""
    source = source.resolve()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{FORMAT_VERSION}\0{name}\0{source}\0".encode())
    for f in files:
        st = f.stat()
        try:
            rel = str(f.resolve().relative_to(source))
        except ValueError:
            rel = str(f.resolve())
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return CacheKey(name, source, h.hexdigest()[:16])


def lookup(key: CacheKey) -> Path | None:
    """The existing cache file for ``key``, if any."""
    for d in cache_dirs(key.source):
        p = d / key.filename
        if p.is_file():
            return p
    return None


def load(path: Path) -> RawSplits | None:
    """Read a cache file; a damaged one is deleted and None returned (the caller re-decodes)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in _KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        log.warning("ignoring damaged cache file %s (%s)", path, err)
        discard(path)
        return None
    return RawSplits(**arrays)


def discard(path: Path) -> None:
    """Delete one cache file, quietly if it is already gone or cannot be removed."""
    try:
        path.unlink()
    except OSError as err:
        if path.exists():
            log.warning("cannot remove cache file %s (%s)", path, err)


def _remove_stale(directory: Path, key: CacheKey) -> None:
    for p in directory.glob(f"{key.prefix}-*.npz"):
        if p.name != key.filename:
            log.info("removing stale cache file %s", p)
            discard(p)


def save(key: CacheKey, raw: RawSplits) -> Path | None:
    """Write ``raw`` atomically in the first usable cache directory; None if none is writable."""
    for d in cache_dirs(key.source):
        tmp_name = None
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d, prefix=".tmp-", suffix=".npz",
                                             delete=False) as f:
                tmp_name = f.name
                np.savez(f, **{k: getattr(raw, k) for k in _KEYS})
            os.chmod(tmp_name, 0o644)  # NamedTemporaryFile makes it private (0600)
            final = d / key.filename
            os.replace(tmp_name, final)
        except OSError as err:
            log.info("cannot cache in %s (%s); trying the next location", d, err)
            if tmp_name is not None:
                discard(Path(tmp_name))
            continue
        _remove_stale(d, key)
        log.info("cached decoded %s in %s", key.name, final)
        return final
    log.warning("no writable cache directory for %s; it will be decoded again next time",
                key.source)
    return None


def clear(name: str, source: Path) -> list[Path]:
    """Delete every cache entry of dataset ``name`` read from ``source``; returns the paths."""
    key = CacheKey(name, source.resolve(), "")
    removed = []
    for d in cache_dirs(key.source):
        for p in d.glob(f"{key.prefix}-*.npz"):
            discard(p)
            removed.append(p)
    return removed
