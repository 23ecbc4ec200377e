"""A client's own data as a Hugging Face ``datasets.save_to_disk`` folder (what
``flwr-datasets create`` and Flower's embedded-devices example write).

``datasets`` is an optional import: without it such a folder is refused in one line that says
``pip install datasets``. A ``Dataset`` folder (``dataset_info.json``/``state.json``) is the
training part; a ``DatasetDict`` folder (``dataset_dict.json``) gives ``train`` and, when it
has one, ``test`` (a single split of another name is the training part). The image column (a
``datasets.Image`` feature) is decoded with Pillow; without one, the numeric scalar columns
other than the label are the features. The label column holds
integers with ``ClassLabel`` names, strings, or integers taken as their text.
"""

from __future__ import annotations

from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.data.errors import ClientDataError

#: Files that mark a ``save_to_disk`` folder (a Dataset, or a DatasetDict).
MARKERS: tuple[str, ...] = ("dataset_info.json", "state.json", "dataset_dict.json")
_BATCH = 256


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in MARKERS)


def load_parts(path: Path) -> dict[str, Any]:
    """``{"train": Dataset}`` and ``"test"`` when the folder has a test split."""
    try:
        import datasets
    except ImportError:
        raise ClientDataError(f"{path}: a Hugging Face datasets folder; reading it needs the "
                              "datasets package: pip install datasets") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises several types for a damaged folder
        raise ClientDataError(f"{path}: cannot load the datasets folder ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = dict(loaded)
        if "train" in splits:
            parts = {"train": splits["train"]}
            if "test" in splits:
                parts["test"] = splits["test"]
            return parts
        if len(splits) == 1:
            return {"train": next(iter(splits.values()))}
        raise ClientDataError(f"{path}: splits {', '.join(sorted(splits))}; expected train "
                              "(and optionally test)")
    return {"train": loaded}


def image_column(ds: Any) -> str | None:
    """The first column holding images (a ``datasets.Image`` feature), or None."""
    import datasets

    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image):
            return name
    return None


def feature_columns(ds: Any, label_column: str) -> list[str]:
    """Numeric scalar columns other than the label, in the dataset's order."""
    import datasets

    return [name for name, f in ds.features.items()
            if name != label_column and isinstance(f, datasets.Value)
            and (f.dtype.startswith(("int", "uint", "float")) or f.dtype == "bool")]


def label_names(ds: Any, label_column: str, where: str) -> np.ndarray:
    """The class name of every row: ``ClassLabel`` names, strings, or integers' text."""
    import datasets

    if label_column not in ds.features:
        raise ClientDataError(f"{where}: no label column {label_column!r} (columns: "
                              f"{', '.join(ds.features)}; name it with --label-column)")
    feature = ds.features[label_column]
    values = ds[label_column]
    if isinstance(feature, datasets.ClassLabel):
        try:
            return np.asarray(feature.int2str(list(values)), dtype=str)
        except ValueError as err:
            raise ClientDataError(f"{where}: column {label_column!r}: {err}") from None
    if isinstance(feature, datasets.Value) and (feature.dtype.startswith(("int", "uint"))
                                                or feature.dtype in ("string", "large_string")):
        return np.char.strip(np.asarray([str(v) for v in values], dtype=str))
    raise ClientDataError(f"{where}: label column {label_column!r} is {feature}; labels are "
                          "ClassLabel integers, strings or integers")


def _raw_images(ds: Any, column: str) -> Iterator[dict]:
    """Each image of ``column`` undecoded ({"bytes", "path"})."""
    import datasets

    raw = ds.cast_column(column, datasets.Image(decode=False))
    for start in range(0, len(raw), _BATCH):
        yield from raw[start:start + _BATCH][column]


def open_raw(item: dict, where: str) -> Any:
    """A Pillow image (lazily decoded) from an undecoded ``datasets.Image`` value."""
    from PIL import Image

    try:
        if item.get("bytes"):
            return Image.open(BytesIO(item["bytes"]))
        return Image.open(item["path"])
    except Exception as err:  # Pillow raises many types on damaged files
        raise ClientDataError(f"{where}: cannot read image ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})") from None


def image_headers(ds: Any, column: str, where: str) -> Iterator[tuple[str, tuple[int, int]]]:
    """(mode, (width, height)) of every image, from its header."""
    for i, item in enumerate(_raw_images(ds, column)):
        with open_raw(item, f"{where}, image {i}") as im:
            yield im.mode, im.size


def images(ds: Any, column: str, where: str) -> Iterator[Any]:
    """Every image of ``column`` as a decoded Pillow image."""
    for i, item in enumerate(_raw_images(ds, column)):
        im = open_raw(item, f"{where}, image {i}")
        try:
            im.load()
        except Exception as err:  # Pillow raises many types on damaged files
            raise ClientDataError(f"{where}, image {i}: cannot read image "
                                  f"({type(err).__name__}: {err})") from None
        yield im


def table(ds: Any, columns: list[str], where: str) -> np.ndarray:
    """The feature columns as an (N, F) array (as stored; checked by the caller)."""
    if not columns:
        raise ClientDataError(f"{where}: no image column and no numeric feature columns")
    return np.stack([np.asarray(ds[c]) for c in columns], axis=1)


__all__ = ["MARKERS", "feature_columns", "image_column", "image_headers", "images",
           "is_hf_folder", "label_names", "load_parts", "open_raw", "table"]
