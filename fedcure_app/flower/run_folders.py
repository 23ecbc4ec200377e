"""One folder per ``flwr run``, and a ``latest`` pointer that only a finished run moves.

Under ``out-dir`` (default ``results/flwr``) run ``R`` writes ``R/result.json`` and the plots.
When it has written them it replaces ``out-dir/latest``, a one-line text file holding the
folder's name: a plain file rather than a symbolic link, so it reads the same on every platform
and file system (``cat results/flwr/latest``; in Python :func:`latest_run`). A run that fails
writes ``R/failed.txt`` (its one-line reason) and leaves ``latest`` and every other run's folder
as they were.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the pointer file's name under ``out-dir``
LATEST = "latest"
#: the note a failed run leaves in its folder
FAILED = "failed.txt"


def run_dir(base: Path, run_id: int | str) -> Path:
    """The folder of run ``run_id`` under ``base`` (not created)."""
    name = str(run_id)
    if not name or name in (".", "..", LATEST) or "/" in name or os.sep in name:
        raise ValueError(f"not a run folder name: {name!r}")
    return base / name


def mark_latest(base: Path, run_id: int | str) -> Path:
    """Point ``base/latest`` at run ``run_id`` (atomic replace: a reader sees the old or the new
    name, never half a file); returns the pointer's path."""
    name = run_dir(base, run_id).name
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".{LATEST}.{os.getpid()}.tmp"
    tmp.write_text(name + "\n")
    os.replace(tmp, base / LATEST)
    return base / LATEST


def latest_run(base: Path) -> Path | None:
    """The folder ``base/latest`` names, when it exists; None before the first finished run."""
    try:
        name = (base / LATEST).read_text().strip()
    except OSError:
        return None
    try:
        folder = run_dir(base, name)
    except ValueError:
        return None
    return folder if folder.is_dir() else None


def note_failure(folder: Path, reason: str) -> Path | None:
    """Write ``folder/failed.txt`` (the reason, one line); None when it cannot be written (the
    log line already said it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FAILED
        path.write_text(" ".join(reason.split()) + "\n")
        return path
    except OSError:
        return None


__all__ = ["FAILED", "LATEST", "latest_run", "mark_latest", "note_failure", "run_dir"]
