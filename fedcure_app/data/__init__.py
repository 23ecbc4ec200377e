"""Dataset readers (MNIST IDX, CIFAR-10 pickles, SVHN .mat, CINIC-10 PNG folders, scikit-learn
digits), a decode cache, client partitioners and a label-distribution plot.

``load_dataset(name, data_dir)`` returns a :class:`Dataset` of normalised float32 NCHW images;
:func:`fedcure_app.data.partition.partition_dataset` splits its training labels among clients.
"""

from fedcure_app.data.dataset import Dataset, RawSplits
from fedcure_app.data.errors import CorruptDatasetError, DatasetError, MissingDatasetError
from fedcure_app.data.loader import clear_cache, default_data_dir, load_dataset, locate_source
from fedcure_app.data.specs import SPECS, DatasetSpec, canonical_name

DATASETS: tuple[str, ...] = tuple(SPECS)

__all__ = [
    "DATASETS",
    "SPECS",
    "CorruptDatasetError",
    "Dataset",
    "DatasetError",
    "DatasetSpec",
    "MissingDatasetError",
    "RawSplits",
    "canonical_name",
    "clear_cache",
    "default_data_dir",
    "load_dataset",
    "locate_source",
]
