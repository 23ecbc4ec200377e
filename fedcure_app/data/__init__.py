"""Dataset readers (MNIST IDX, CIFAR-10 pickles, SVHN .mat, CINIC-10 PNG folders, scikit-learn
digits), a decode cache, client partitioners, a label-distribution plot, and a user's own task
(:mod:`fedcure_app.data.task`) and data (:mod:`fedcure_app.data.own`).

``load_dataset(name, data_dir)`` returns a :class:`Dataset` of normalised float32 NCHW images;
:func:`fedcure_app.data.partition.partition_dataset` splits its training labels among clients.
The names below load on first use (PEP 562), so importing :mod:`fedcure_app.data.task` (what
the configuration schema needs) loads no NumPy.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_LAZY: dict[str, str] = {
    "Dataset": "dataset", "RawSplits": "dataset",
    "CorruptDatasetError": "errors", "DatasetError": "errors", "MissingDatasetError": "errors",
    "clear_cache": "loader", "default_data_dir": "loader", "load_dataset": "loader",
    "locate_source": "loader",
    "SPECS": "specs", "DatasetSpec": "specs", "canonical_name": "specs",
}


def __getattr__(name: str) -> Any:
    if name == "DATASETS":
        return tuple(importlib.import_module("fedcure_app.data.specs").SPECS)
    if name in _LAZY:
        return getattr(importlib.import_module(f"fedcure_app.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fedcure_app.data' has no attribute {name!r}")


__all__ = ["DATASETS", *sorted(_LAZY)]
