"""Optional downloads through torchvision, only where torchvision imports; nothing else needs it.

torchvision writes the same layouts the readers look for: ``<root>/MNIST/raw``,
``<root>/cifar-10-batches-py`` and ``<root>/{train,test}_32x32.mat``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedcure_app.data.errors import DatasetError
from fedcure_app.data.specs import SPECS

log = logging.getLogger(__name__)

#: Datasets torchvision can fetch, and the class name it uses.
DOWNLOADABLE: dict[str, str] = {"mnist": "MNIST", "cifar10": "CIFAR10", "svhn": "SVHN"}


def _torchvision_datasets():
    try:
        # lazy and guarded: torchvision is an optional extra ([vision]) that may be absent
        # or fail to import; only a download needs it
        import torchvision.datasets as tvd
    except Exception as err:  # a missing or broken install can fail in many ways
        return None, f"{type(err).__name__}: {err}"
    return tvd, ""


def download(name: str, root: Path) -> None:
    """Fetch dataset ``name`` into ``root`` with torchvision, or raise a DatasetError saying how
    to get the files by hand."""
    url = SPECS[name].url
    if name not in DOWNLOADABLE:
        raise DatasetError(
            f"--download is not available for {name} (torchvision has no downloader for it); "
            f"get the files from {url} and put them under {root}"
        )
    tvd, why = _torchvision_datasets()
    if tvd is None:
        raise DatasetError(
            f"--download needs torchvision, which cannot be imported here ({why}); "
            f"get the {name} files from {url} and put them under {root}"
        )
    cls = getattr(tvd, DOWNLOADABLE[name])
    root.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s into %s with torchvision", name, root)
    try:
        if name == "svhn":
            for split in ("train", "test"):
                cls(str(root), split=split, download=True)
        else:
            for train in (True, False):
                cls(str(root), train=train, download=True)
    except Exception as err:  # network and archive errors come in many types
        raise DatasetError(
            f"downloading {name} into {root} failed ({type(err).__name__}: {err}); "
            f"get the files from {url} by hand"
        ) from None
