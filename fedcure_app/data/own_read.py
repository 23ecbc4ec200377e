"""Reading one client's data for a task: which format PATH is (:func:`resolve`), its parts as
the task takes them (:func:`read_parts`) and its class names as the task's label indices
(:func:`check_classes`); the entries of a folder of clients (:func:`client_entries`). The public
entry point is :func:`fedcure_app.data.own.read_client_data`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedcure_app.data import own_hf, own_images, own_tables
from fedcure_app.data.errors import ClientDataError
from fedcure_app.data.task import TaskConfig

#: Data file suffixes a client PATH may name (or a folder may hold as its only file).
DATA_SUFFIXES: tuple[str, ...] = (".csv", ".npz")
#: Parts of a client's data: (x as stored or decoded, class name of each sample).
Parts = dict[str, tuple[np.ndarray, np.ndarray]]


def links_outside(root: Path) -> list[Path]:
    """The symbolic links under the folder ``root`` (hidden entries aside, links not followed)
    whose target lies outside ``root`` (or does not exist), in walk order."""
    base = root.resolve()
    found: list[Path] = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if entry.is_symlink():
                    target = Path(entry.path).resolve()
                    if not (target.exists() and target.is_relative_to(base)):
                        found.append(Path(entry.path))
                elif entry.is_dir():
                    stack.append(Path(entry.path))
    return found


def check_links(root: Path) -> None:
    """Refuse a folder ``root`` holding a symbolic link out of it (naming the first link and
    counting them): a client reads only what lies under its PATH."""
    outside = links_outside(root)
    if outside:
        more = f" (and {len(outside) - 1} more)" if len(outside) > 1 else ""
        raise ClientDataError(f"{outside[0]}: a symbolic link out of {root}{more}; a client "
                              "reads only what lies under its PATH (copy the file in instead)",
                              "symlink-outside", len(outside))


def resolve(path: str | Path) -> tuple[Path, str]:
    """The file or folder to read and its format (folders, npz, csv, datasets). A folder whose
    only entry is one ``.csv``/``.npz`` file stands for that file. Refused: PATH missing or
    empty, a file of another kind, or a folder holding a link out of it
    (:func:`check_links`)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ClientDataError(f"{p}: no such file or folder", "unreadable", 1)
    if p.is_dir():
        check_links(p)
    if p.is_file():
        fmt = p.suffix.lower().lstrip(".")
        if fmt not in ("csv", "npz"):
            raise ClientDataError(f"{p}: not a .csv or .npz file (nor a folder of class "
                                  "folders or a datasets folder)", "bad-format")
        if p.stat().st_size == 0:
            raise ClientDataError(f"{p}: empty file", "no-samples")
        return p, fmt
    if own_hf.is_hf_folder(p):
        return p, "datasets"
    entries = own_images.visible(p)
    if not entries:
        raise ClientDataError(f"{p}: empty folder", "no-samples")
    if len(entries) == 1 and entries[0].is_file() and entries[0].suffix.lower() in DATA_SUFFIXES:
        return resolve(entries[0])
    return p, "folders"


def client_entries(folder: str | Path) -> list[Path]:
    """The client entries of a folder of clients, sorted by name: its visible subfolders and
    ``.csv``/``.npz`` files (other files, a README say, are skipped)."""
    p = Path(folder).expanduser()
    if not p.is_dir():
        raise ClientDataError(f"{p}: not a folder")
    found = [e for e in own_images.visible(p)
             if e.is_dir() or e.suffix.lower() in DATA_SUFFIXES]
    if not found:
        raise ClientDataError(f"{p}: no client folders or .csv/.npz files")
    return found


def _need(task: TaskConfig, kind: str, where: str, what: str) -> None:
    if task.kind != kind:
        raise ClientDataError(f"{where}: {what}, the task's kind is {task.kind}", "bad-format")


def read_parts(path: Path, fmt: str, task: TaskConfig, label_column: str = "label") -> Parts:
    """Every part of one client's data as the task takes it (x typed and shaped, names not yet
    mapped)."""
    where = str(path)
    if fmt == "folders":
        _need(task, "image", where, "a folder of image class folders")
        listed = own_images.image_parts(path)
        for paths, names in listed.values():  # an unknown class before decoding anything
            check_classes(np.asarray(names, dtype=str), task,
                          lambda name, p=paths, n=names: str(p[n.index(name)].parent))
        converted = sum(own_images.check_headers(paths, task.sample_shape, task.resize,
                                                 task.convert)  # sizes before decoding
                        for paths, _ in listed.values())
        own_images.log_converted(where, converted, task.sample_shape[0])
        return {part: (own_images.decode_files(paths, task.sample_shape, task.resize,
                                               task.convert),
                       np.asarray(names, dtype=str))
                for part, (paths, names) in listed.items()}
    if fmt == "csv":
        _need(task, "tabular", where, "a CSV holds table rows")
        x, names, _ = own_tables.read_csv(path, label_column)
        if x.shape[1] != task.features:
            raise ClientDataError(f"{where}: {x.shape[1]} feature columns (besides "
                                  f"{label_column!r}), the task has features = {task.features}",
                                  "shape-mismatch", 1)
        return {"train": (x, np.asarray(names, dtype=str))}
    if fmt == "npz":
        out: Parts = {}
        for part, (x, names) in own_tables.read_npz(path, task.classes).items():
            if task.kind == "image":
                x = own_images.pixel_array(x, task.sample_shape, task.resize, where,
                                           task.convert)
            else:
                x = own_tables.table_array(x, task.features, where)
            out[part] = (x, names)
        return out
    return _read_datasets(path, task, label_column)


def _read_datasets(path: Path, task: TaskConfig, label_column: str) -> Parts:
    out: Parts = {}
    for part, ds in own_hf.load_parts(path).items():
        where = f"{path} ({part})"
        names = own_hf.label_names(ds, label_column, where)
        column = own_hf.image_column(ds)
        if task.kind == "image":
            if column is None:
                raise ClientDataError(f"{where}: no image column, the task's kind is image")
            check_classes(names, task, lambda _n: where)
            x = own_images.decode_pils(own_hf.images(ds, column, where), len(ds),
                                       task.sample_shape, task.resize, where, task.convert)
        else:
            if column is not None:
                raise ClientDataError(f"{where}: an image column ({column}), the task's kind "
                                      "is tabular")
            raw = own_hf.table(ds, own_hf.feature_columns(ds, label_column), where)
            x = own_tables.table_array(raw, task.features, where)
        out[part] = (x, names)
    return out


def check_classes(names: np.ndarray, task: TaskConfig, where_of) -> np.ndarray:
    """``names`` as int64 indices into ``task.classes``; a name the task lacks is refused
    naming it and ``where_of(name)`` (the folder or file holding it)."""
    lookup = {c: i for i, c in enumerate(task.classes)}
    uniq, inverse = np.unique(names, return_inverse=True)
    unknown = [name for name in uniq.tolist() if name not in lookup]
    if unknown:
        name = unknown[0]
        shown = ", ".join(task.classes[:8]) + (", …" if task.num_classes > 8 else "")
        more = f" (and {len(unknown) - 1} more unknown)" if len(unknown) > 1 else ""
        raise ClientDataError(f"{where_of(name)}: class {name!r} is not in the task's "
                              f"classes ({shown}){more}", "unknown-class", len(unknown))
    table = np.asarray([lookup[n] for n in uniq.tolist()], dtype=np.int64)
    return table[inverse.reshape(-1)] if len(uniq) else np.zeros(0, dtype=np.int64)


__all__ = ["DATA_SUFFIXES", "Parts", "check_classes", "check_links", "client_entries",
           "links_outside", "read_parts", "resolve"]
