"""Finding a dataset's files under a root directory, with errors that say what was expected."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from fedcure_app.data.errors import MissingDatasetError


def unique_dirs(candidates: Iterable[Path]) -> list[Path]:
    """Candidates in order, without repeats (``root/.`` and ``root`` are the same)."""
    seen: set[Path] = set()
    out = []
    for c in candidates:
        key = c.resolve() if c.exists() else c
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def find_dir(
    root: Path,
    candidates: Iterable[Path],
    is_complete: Callable[[Path], bool],
    *,
    dataset: str,
    expected: str,
    url: str,
    downloadable: bool = True,
) -> Path:
    """The first candidate directory that ``is_complete``; otherwise a MissingDatasetError.

    The error names what was expected, every directory looked in, and where to get the files.
    """
    dirs = unique_dirs(candidates)
    for d in dirs:
        if d.is_dir() and is_complete(d):
            return d
    where = ", ".join(str(d) for d in dirs)
    hint = "" if root.is_dir() else f" (directory {root} does not exist)"
    fetch = f"get the files from {url}"
    if downloadable:
        key = dataset.lower().replace("-", "")
        fetch += (f" or fetch them with `fedcure data info --dataset {key} --data-dir {root}"
                  " --download` (needs torchvision)")
    raise MissingDatasetError(
        f"{dataset} not found{hint}: expected {expected} in one of: {where}; {fetch}"
    )
