"""On-disk cache of decoded uint8 splits (``.npz``), so a second load skips decoding.

Where: ``$FEDCURE_CACHE_DIR`` when set; otherwise a ``.fedcure-cache`` folder inside the source
directory when that directory is writable (judged by its permission bits too, so a read-only
share stays untouched even for root); otherwise the user cache, ``$XDG_CACHE_HOME/fedcure`` or
``~/.cache/fedcure``.

Entry names are ``<dataset>-<hash of the absolute source dir>-<hash of the source files' names,
sizes and mtimes>.npz``: changing any source file changes the name, so a stale entry is never
read, and it is deleted when the fresh one is written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcure_app.data.dataset import RawSplits

log = logging.getLogger(__name__)

#: Bump when the cached arrays' layout changes.
FORMAT_VERSION = 1
CACHE_DIRNAME = ".fedcure-cache"
_KEYS = ("x_train", "y_train", "x_test", "y_test")


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedcure``, else ``~/.cache/fedcure``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "fedcure"


def _writable_dir(d: Path) -> bool:
    """True when ``d`` is a directory we may write to, by permission bits as well as access()."""
    try:
        st = d.stat()
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & 0o222)
            and os.access(d, os.W_OK | os.X_OK))


def cache_dirs(source: Path) -> list[Path]:
    """Directories to use for ``source``'s cache, most preferred first."""
    override = os.environ.get("FEDCURE_CACHE_DIR")
    if override:
        return [Path(override)]
    beside = source / CACHE_DIRNAME
    dirs = []
    if _writable_dir(beside) or (not beside.exists() and _writable_dir(source)):
        dirs.append(beside)
    dirs.append(user_cache_dir())
    return dirs


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
