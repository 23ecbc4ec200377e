"""``load_dataset``: find a dataset's files, decode them (or reuse the cache), normalise."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedcure_app.data import cache as _cache
from fedcure_app.data import cifar, cinic, digits, mnist, svhn
from fedcure_app.data.dataset import Dataset, RawSplits, build_dataset
from fedcure_app.data.download import download as _download
from fedcure_app.data.errors import CorruptDatasetError, MissingDatasetError
from fedcure_app.data.specs import SPECS, canonical_name

log = logging.getLogger(__name__)

#: Environment variable naming the default data root.
DATA_DIR_ENV = "FEDCURE_DATA_DIR"


@dataclass(frozen=True)
class FileReader:
    """How to find, list and decode one file-based dataset."""

    locate: Callable[[Path], Path]
    source_files: Callable[[Path], list[Path]]
    read: Callable[[Path], RawSplits]
    #: what the source is, for ``fedcure data info`` and results (default: its path)
    describe: Callable[[Path], str] = str


READERS: dict[str, FileReader] = {
    "mnist": FileReader(mnist.locate, mnist.source_files, mnist.read),
    "cifar10": FileReader(cifar.locate, cifar.source_files, cifar.read, cifar.describe),
    "svhn": FileReader(svhn.locate, svhn.source_files, svhn.read),
    "cinic10": FileReader(cinic.locate, cinic.source_files, cinic.read),
}


def default_data_dir() -> Path:
    """``$FEDCURE_DATA_DIR`` if set, else ``./data``."""
    return Path(os.environ.get(DATA_DIR_ENV) or "data")


def locate_source(name: str, data_dir: str | Path | None = None, *,
                  download: bool = False) -> Path:
    """The directory dataset ``name``'s files are read from (downloading first if asked)."""
    key = canonical_name(name)
    if key not in READERS:
        raise ValueError(f"{key} has no files: it is bundled with scikit-learn")
    root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    reader = READERS[key]
    try:
        return reader.locate(root)
    except MissingDatasetError:
        if not download:
            raise
    _download(key, root)
    return reader.locate(root)


def unused_data_dir(name: str, data_dir: str | Path | None,
                    flag: str = "--data-dir") -> str | None:
    """One line saying ``data_dir`` is not used, when dataset ``name`` is bundled (digits) and
    a data folder was given anyway; it names a dataset the folder holds, if any (the user may
    have meant ``--dataset`` that one). None otherwise."""
    if not data_dir or canonical_name(name) in READERS:
        return None
    held = []
    for other, reader in READERS.items():
        try:
            reader.locate(Path(data_dir).expanduser())
            held.append(other)
        except (MissingDatasetError, OSError, ValueError):
            continue
    hint = (f"; it holds {', '.join(held)}: add --dataset {held[0]} to train on that"
            if held else "")
    return (f"{flag} {data_dir} is not used: {canonical_name(name)} is bundled with "
            f"scikit-learn{hint}")


def _read_or_cached(key: str, source: Path, use_cache: bool) -> tuple[RawSplits, bool]:
    """Decoded splits of ``source`` and whether they came from the cache."""
    spec = SPECS[key]
    reader = READERS[key]
    files = reader.source_files(source)
    ckey = _cache.make_key(key, source, files) if use_cache else None
    if ckey is not None:
        hit = _cache.lookup(ckey)
        if hit is not None:
            raw = _cache.load(hit)
            if raw is not None:
                try:
                    raw.validate(spec, str(hit))
                    log.info("%s: using cache %s", key, hit)
                    return raw, True
                except CorruptDatasetError as err:
                    log.warning("ignoring invalid cache file: %s", err)
                    _cache.discard(hit)
    raw = reader.read(source)
    raw.validate(spec, str(source))
    if ckey is not None:
        _cache.save(ckey, raw)
    return raw, False


def load_raw(name: str, data_dir: str | Path | None = None, *, cache: bool = True,
             download: bool = False) -> tuple[RawSplits, str, bool]:
    """Dataset ``name``'s decoded uint8 splits (not normalised), where they came from and
    whether from the cache; the arguments as :func:`load_dataset`'s. A deployed client cuts
    its partition from these and keeps its images as uint8 (a quarter of float32's bytes)."""
    key = canonical_name(name)
    if key == "digits":
        return digits.read(), "scikit-learn digits (bundled)", False
    src = locate_source(key, data_dir, download=download)
    raw, from_cache = _read_or_cached(key, src, cache)
    return raw, READERS[key].describe(src), from_cache


def load_dataset(name: str, data_dir: str | Path | None = None, *, cache: bool = True,
                 download: bool = False) -> Dataset:
    """Load dataset ``name`` (digits, mnist, cifar10, svhn, cinic10) as a normalised Dataset.

    ``data_dir``: root holding the files (default ``$FEDCURE_DATA_DIR`` or ``./data``; unused for
    digits). ``cache``: reuse/write decoded arrays (see :mod:`fedcure_app.data.cache`).
    ``download``: fetch missing files with torchvision where it imports.
    Raises :class:`~fedcure_app.data.errors.DatasetError` for missing or damaged files.
    """
    key = canonical_name(name)
    spec = SPECS[key]
    started = time.perf_counter()
    raw, source, from_cache = load_raw(key, data_dir, cache=cache, download=download)
    ds = build_dataset(spec, raw, source, from_cache)
    log.info("loaded %s (%d train, %d test) from %s%s in %.3f s", key, ds.train_size,
             ds.test_size, source, " (cache)" if from_cache else "",
             time.perf_counter() - started)
    return ds


def clear_cache(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """Delete the cached decode of dataset ``name`` under ``data_dir``; returns removed files."""
    key = canonical_name(name)
    if key not in READERS:
        return []
    return _cache.clear(key, locate_source(key, data_dir))
