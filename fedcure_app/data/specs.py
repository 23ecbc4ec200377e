"""What each dataset is: shape, classes, normalisation constants, official source.

Normalisation constants are the customary per-channel mean/std of the training split on the
[0, 1] pixel scale (pixel value / ``pixel_max``).
"""

from __future__ import annotations

from dataclasses import dataclass

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))


@dataclass(frozen=True)
class DatasetSpec:
    """Static facts about one dataset."""

    name: str
    #: (C, H, W) of one sample.
    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    #: Per-channel mean and std on the [0, 1] scale.
    mean: tuple[float, ...]
    std: tuple[float, ...]
    #: Raw pixel value that maps to 1.0 (255 for 8-bit images, 16 for scikit-learn digits).
    pixel_max: float
    #: Where to get the official files (text for error messages; empty for bundled data).
    url: str = ""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


SPECS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(
        "digits", (1, 8, 8), DIGIT_CLASSES, (0.30526,), (0.37605,), 16.0,
        "bundled with scikit-learn (sklearn/datasets/data/digits.csv.gz)",
    ),
    "mnist": DatasetSpec(
        "mnist", (1, 28, 28), DIGIT_CLASSES, (0.1307,), (0.3081,), 255.0,
        "https://yann.lecun.com/exdb/mnist/ "
        "(mirror: https://ossci-datasets.s3.amazonaws.com/mnist/)",
    ),
    "cifar10": DatasetSpec(
        "cifar10", (3, 32, 32), CIFAR10_CLASSES,
        (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 255.0,
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (extract it)",
    ),
    "svhn": DatasetSpec(
        "svhn", (3, 32, 32), DIGIT_CLASSES,
        (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), 255.0,
        "http://ufldl.stanford.edu/housenumbers/ (format 2: train_32x32.mat, test_32x32.mat)",
    ),
    "cinic10": DatasetSpec(
        "cinic10", (3, 32, 32), CIFAR10_CLASSES,
        (0.47889522, 0.47227842, 0.43047404), (0.24205776, 0.23828046, 0.25874835), 255.0,
        "https://datashare.ed.ac.uk/handle/10283/3192 (CINIC-10.tar.gz, extract it)",
    ),
}

#: Accepted spellings -> canonical name.
_ALIASES: dict[str, str] = {"cifar": "cifar10", "cinic": "cinic10"}


def canonical_name(name: str) -> str:
    """Canonical dataset name (``"CIFAR-10"`` -> ``"cifar10"``); unknown names raise ValueError."""
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    key = _ALIASES.get(key, key)
    if key not in SPECS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(SPECS)}")
    return key
