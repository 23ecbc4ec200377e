"""The decode cache: hit on the second load, invalidated by changes, kept in the user cache
($FEDCURE_CACHE_DIR, else ~/.cache/fedcure), never in the data folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from fedcure_app.data import clear_cache, load_dataset, loader, mnist
from fedcure_app.data.loader import FileReader
from tests.data.builders import idx_bytes, write_mnist


def _npz(d: Path) -> list[Path]:
    return sorted(d.glob("mnist-*.npz")) if d.is_dir() else []


def _files(d: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``d`` (hidden ones too) with its size and mtime."""
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in d.rglob("*") if p.is_file()}


@pytest.fixture
def cache_home(_isolated_cache: Path) -> Path:
    """The user cache folder the tests' loads write to."""
    return _isolated_cache / "fedcure"


@pytest.fixture
def counting_reader(monkeypatch):
    """Count how often the MNIST files are actually decoded."""
    calls = []

    def read(directory):
        calls.append(directory)
        return mnist.read(directory)

    monkeypatch.setitem(loader.READERS, "mnist",
                        FileReader(mnist.locate, mnist.source_files, read))
    return calls


def test_second_load_comes_from_cache(tmp_path: Path, counting_reader, cache_home):
    src = tmp_path / "raw"
    write_mnist(src)
    first = load_dataset("mnist", tmp_path)
    second = load_dataset("mnist", tmp_path)
    assert len(counting_reader) == 1
    assert not first.from_cache and second.from_cache
    assert len(_npz(cache_home)) == 1
    np.testing.assert_array_equal(first.x_train, second.x_train)
    np.testing.assert_array_equal(first.y_test, second.y_test)


def test_changed_source_invalidates_and_replaces_entry(tmp_path: Path, counting_reader,
                                                        cache_home):
    src = tmp_path / "raw"
    write_mnist(src, gz=False)
    load_dataset("mnist", tmp_path)
    old = _npz(cache_home)
    (src / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.full(5, 7, np.uint8)))
    ds = load_dataset("mnist", tmp_path)
    assert not ds.from_cache and len(counting_reader) == 2
    np.testing.assert_array_equal(ds.y_test, np.full(5, 7))
    new = _npz(cache_home)
    assert len(new) == 1 and new != old  # the stale entry is gone
    assert load_dataset("mnist", tmp_path).from_cache


def test_mtime_change_alone_invalidates(tmp_path: Path, counting_reader):
    src = tmp_path / "raw"
    write_mnist(src)
    load_dataset("mnist", tmp_path)
    f = src / "train-images-idx3-ubyte.gz"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert not load_dataset("mnist", tmp_path).from_cache
    assert len(counting_reader) == 2


def test_loading_writes_nothing_under_the_data_folder(tmp_path: Path, cache_home,
                                                      counting_reader):
    # the tests run as root, which ignores permission bits: what pins the behaviour is that
    # no file under the data folder appears or changes, whatever its permissions
    write_mnist(tmp_path / "raw")
    before = _files(tmp_path)
    assert not load_dataset("mnist", tmp_path).from_cache
    assert load_dataset("mnist", tmp_path).from_cache
    assert _files(tmp_path) == before
    assert len(_npz(cache_home)) == 1 and len(counting_reader) == 1


def test_a_read_only_data_folder_loads_and_caches(tmp_path: Path, cache_home, counting_reader):
    src = tmp_path / "raw"
    write_mnist(src)
    modes = {p: p.stat().st_mode for p in (tmp_path, src)}
    for p in modes:
        p.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        assert not load_dataset("mnist", tmp_path).from_cache
        assert load_dataset("mnist", tmp_path).from_cache
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["raw", *(p.name for p in src.iterdir())])
    assert len(_npz(cache_home)) == 1 and len(counting_reader) == 1


def test_explicit_cache_dir(tmp_path: Path, monkeypatch):
    write_mnist(tmp_path / "raw")
    monkeypatch.setenv("FEDCURE_CACHE_DIR", str(tmp_path / "my-cache"))
    load_dataset("mnist", tmp_path)
    assert len(_npz(tmp_path / "my-cache")) == 1
    assert not _npz(tmp_path / "raw")
    assert load_dataset("mnist", tmp_path).from_cache


def test_damaged_cache_is_redecoded(tmp_path: Path, counting_reader, caplog, cache_home):
    src = tmp_path / "raw"
    write_mnist(src)
    load_dataset("mnist", tmp_path)
    (entry,) = _npz(cache_home)
    entry.write_bytes(b"not a zip file")
    ds = load_dataset("mnist", tmp_path)
    assert not ds.from_cache and len(counting_reader) == 2
    assert "damaged cache file" in caplog.text
    assert load_dataset("mnist", tmp_path).from_cache


def test_cache_with_wrong_shapes_is_ignored(tmp_path: Path, counting_reader, cache_home):
    src = tmp_path / "raw"
    write_mnist(src)
    load_dataset("mnist", tmp_path)
    (entry,) = _npz(cache_home)
    z = np.zeros((3, 1, 8, 8), np.uint8)
    with entry.open("wb") as f:
        np.savez(f, x_train=z, y_train=np.zeros(3, np.int64), x_test=z,
                 y_test=np.zeros(3, np.int64))
    assert not load_dataset("mnist", tmp_path).from_cache
    assert len(counting_reader) == 2


def test_no_cache_writes_nothing(tmp_path: Path, _isolated_cache: Path):
    src = tmp_path / "raw"
    write_mnist(src)
    assert not load_dataset("mnist", tmp_path, cache=False).from_cache
    assert not _npz(_isolated_cache / "fedcure")


def test_clear_cache(tmp_path: Path, cache_home):
    src = tmp_path / "raw"
    write_mnist(src)
    load_dataset("mnist", tmp_path)
    removed = clear_cache("mnist", tmp_path)
    assert len(removed) == 1 and not _npz(cache_home)
    assert not load_dataset("mnist", tmp_path).from_cache
