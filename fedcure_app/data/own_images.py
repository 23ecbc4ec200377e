"""Images of a client's own data: class folders, pixel arrays and decoded Pillow images, as
uint8 (N, C, H, W) of the task's shape.

A client's folder is ``<class>/*.{png,jpg,jpeg}`` (any case), optionally under ``train/`` and
``test/``. An image of other channels than the task's (1: Pillow mode ``L``, 3: ``RGB``) is
refused unless the task says ``convert`` (then converted, and the count logged once per client);
one of another size is refused (naming the file and both sizes) unless the task says ``resize``,
then resized bilinearly. Files are checked from their headers before any is decoded
(:func:`check_headers`): none larger than :data:`MAX_IMAGE_PIXELS` is decoded. Pillow is
imported on first use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.data.errors import ClientDataError

#: Image file suffixes read from class folders (compared in lower case).
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
#: Channels -> the Pillow mode an image is converted to.
MODES: dict[int, str] = {1: "L", 3: "RGB"}
#: Images stacked per chunk when a pixel array needs converting or resizing.
_CHUNK = 1024
#: Pillow modes of one channel (grey, with or without alpha); any other mode is 3 channels.
GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
#: The largest image (width × height, from its header) a client decodes: 40 megapixels, a
#: camera's full frame; a larger one is refused before decoding (Pillow's own bomb guard warns
#: only above 89 megapixels).
MAX_IMAGE_PIXELS = 40_000_000

log = logging.getLogger(__name__)


def mode_channels(mode: str) -> int:
    """The channels of a Pillow mode as a task counts them: 1 for :data:`GREY_MODES`, else
    3."""
    return 1 if mode in GREY_MODES else 3


def visible(folder: Path) -> list[Path]:
    """``folder``'s entries without hidden ones (``.DS_Store``, ``.ipynb_checkpoints``),
    sorted by name."""
    return sorted((p for p in folder.iterdir() if not p.name.startswith(".")),
                  key=lambda p: p.name)


def is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES


def has_class_folders(folder: Path) -> bool:
    """Whether some subfolder of ``folder`` holds an image file directly."""
    return any(sub.is_dir() and any(is_image(p) for p in sub.iterdir())
               for sub in visible(folder))


def split_folders(folder: Path) -> dict[str, Path] | None:
    """``{"train": …, "test": …}`` (test optional) when ``folder`` has a ``train/`` of class
    folders, else None (the folder itself holds the class folders)."""
    train = folder / "train"
    if not (train.is_dir() and has_class_folders(train)):
        return None
    parts = {"train": train}
    if (folder / "test").is_dir():
        parts["test"] = folder / "test"
    return parts


def list_class_folders(folder: Path) -> tuple[list[Path], list[str]]:
    """The images under ``folder``'s class folders, sorted by class name then file name, and
    each image's class name (its folder's name). Refused: no image in any class folder, or
    images lying in ``folder`` itself with no class folders."""
    paths: list[Path] = []
    names: list[str] = []
    for sub in visible(folder):
        if not sub.is_dir():
            continue
        found = [p for p in visible(sub) if is_image(p)]
        paths.extend(found)
        names.extend([sub.name] * len(found))
    if not paths:
        loose = [p for p in visible(folder) if is_image(p)]
        if loose:
            raise ClientDataError(f"{folder}: images lie in the folder itself ({loose[0].name}); "
                                  "put each class's images in a folder named after the class")
        raise ClientDataError(f"{folder}: no {'/'.join(s[1:] for s in IMAGE_SUFFIXES)} images "
                              "in any class folder")
    return paths, names


def image_parts(folder: Path) -> dict[str, tuple[list[Path], list[str]]]:
    """``{"train": (paths, class names)}`` and, with a ``test/`` part, ``"test"`` too."""
    parts = split_folders(folder) or {"train": folder}
    return {part: list_class_folders(where) for part, where in parts.items()}


def header(path: Path) -> tuple[str, tuple[int, int]]:
    """An image file's Pillow mode and (width, height), from its header; unreadable: named.
    Pillow's bomb warning is silenced: the size is checked against :data:`MAX_IMAGE_PIXELS`."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return im.mode, im.size
    except Exception as err:  # Pillow raises many types on damaged files
        raise ClientDataError(f"{path}: cannot read image ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})", "unreadable", 1) from None


def _mode(channels: int, where: str) -> str:
    try:
        return MODES[channels]
    except KeyError:
        raise ClientDataError(f"{where}: images convert to 1 (greyscale) or 3 (RGB) channels, "
                              f"the task has {channels}", "task-refused") from None


def _size_problem(size: tuple[int, int], shape: Sequence[int], resize: bool
                  ) -> tuple[str, str] | None:
    """Why an image of ``size`` (W, H) cannot be taken for ``shape`` (code, text): too large
    to decode, or another size without ``resize``; None when it can."""
    _c, h, w = (int(v) for v in shape)
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        return "too-large", (f"image is {size[0]}×{size[1]}, more than the "
                             f"{MAX_IMAGE_PIXELS:,} pixels a client decodes")
    if size != (w, h) and not resize:
        return "shape-mismatch", (f"image is {size[0]}×{size[1]}, the task's input-shape is "
                                  f"{w}×{h} (W×H; set resize = true in the task to resize)")
    return None


def _channel_problem(mode: str, channels: int) -> str:
    return (f"image has {mode_channels(mode)} channel{'s' if mode_channels(mode) > 1 else ''} "
            f"(mode {mode}), the task's input-shape has {channels} (set convert = true in "
            "the task to convert)")


def check_headers(paths: Sequence[Path], shape: Sequence[int], resize: bool,
                  convert: bool) -> int:
    """Check image files from their headers, decoding none: refused (naming the first file
    and counting the others) when one is over :data:`MAX_IMAGE_PIXELS`, of another size
    without ``resize``, or of other channels without ``convert``. Returns how many images
    will be converted to the task's channels."""
    c = int(shape[0])
    _mode(c, str(paths[0]) if paths else "images")
    big: list[tuple[Path, str]] = []
    sized: list[tuple[Path, str]] = []
    other: list[tuple[Path, str]] = []
    for path in paths:
        mode, size = header(path)
        why = _size_problem(size, shape, resize)
        if why is not None:
            (big if why[0] == "too-large" else sized).append((path, why[1]))
        if mode_channels(mode) != c:
            other.append((path, _channel_problem(mode, c)))
    for found, code in ((big, "too-large"), (sized, "shape-mismatch"),
                        (other if not convert else [], "channel-mismatch")):
        if found:
            more = f" (and {len(found) - 1} more such images)" if len(found) > 1 else ""
            raise ClientDataError(f"{found[0][0]}: {found[0][1]}{more}", code, len(found))
    return len(other)


def pil_to_chw(im: Any, shape: Sequence[int], resize: bool, where: str,
               convert: bool = False) -> np.ndarray:
    """A Pillow image as uint8 (C, H, W) of ``shape``, checked from its header before it is
    decoded: refused (naming ``where``) when over :data:`MAX_IMAGE_PIXELS`, of another size
    without ``resize`` (else resized bilinearly), or of other channels without ``convert``
    (else converted to the channels' mode)."""
    from PIL import Image

    c, h, w = (int(v) for v in shape)
    mode = _mode(c, where)
    why = _size_problem(im.size, shape, resize)
    if why is not None:
        raise ClientDataError(f"{where}: {why[1]}", why[0], 1)
    if mode_channels(im.mode) != c and not convert:
        raise ClientDataError(f"{where}: {_channel_problem(im.mode, c)}", "channel-mismatch", 1)
    if im.mode != mode:
        im = im.convert(mode)
    if im.size != (w, h):
        im = im.resize((w, h), Image.Resampling.BILINEAR)
    arr = np.asarray(im, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def decode_files(paths: Sequence[Path], shape: Sequence[int], resize: bool,
                 convert: bool = False) -> np.ndarray:
    """Decode image files into uint8 (N, C, H, W) of ``shape``; an unreadable file, a wrong
    size or other channels (:func:`pil_to_chw`) is refused naming the file. Check the files'
    headers first (:func:`check_headers`) to refuse them all before decoding any."""
    from PIL import Image

    out = np.empty((len(paths), *shape), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as im:
                out[i] = pil_to_chw(im, shape, resize, str(path), convert)
        except ClientDataError:
            raise
        except Exception as err:  # Pillow raises many types on damaged files
            raise ClientDataError(f"{path}: cannot read image ({type(err).__name__}: "
                                  f"{' '.join(str(err).split())})", "unreadable", 1) from None
    return out


def decode_pils(images: Iterable[Any], count: int, shape: Sequence[int], resize: bool,
                where: str, convert: bool = False) -> np.ndarray:
    """Pillow images (``count`` of them) into uint8 (N, C, H, W) (:func:`pil_to_chw`);
    ``where`` names the source (the image's index is added)."""
    out = np.empty((count, *shape), dtype=np.uint8)
    i, converted = -1, 0
    for i, im in enumerate(images):
        if i >= count:
            break
        converted += mode_channels(im.mode) != int(shape[0])
        out[i] = pil_to_chw(im, shape, resize, f"{where}, image {i}", convert)
    if i + 1 < count:
        raise ClientDataError(f"{where}: {i + 1} images, expected {count}", "bad-format")
    log_converted(where, converted, int(shape[0]))
    return out


def log_converted(where: str, count: int, channels: int) -> None:
    """The one log line of a client whose ``count`` images were converted to the task's
    channels (``convert = true``); nothing when none was."""
    if count:
        log.info("%s: %d image%s converted to %d channel%s (convert = true)", where, count,
                 "s" if count != 1 else "", channels, "s" if channels != 1 else "")


def nchw_layout(x: np.ndarray, where: str, channels: int | None = None) -> np.ndarray:
    """An image array (N, H, W), (N, C, H, W) or (N, H, W, C) as a view (N, C, H, W).
    ``channels`` (the task's C) settles a 4-d layout when it matches exactly one axis; without
    it, a last axis of 1 or 3 (and a second that is neither) means channels last."""
    if x.ndim == 3:
        return x[:, None]
    if x.ndim != 4:
        raise ClientDataError(f"{where}: x has shape {list(x.shape)}; images are (N, H, W), "
                              "(N, C, H, W) or (N, H, W, C)")
    first, last = x.shape[1], x.shape[3]
    if channels is not None and (first == channels) != (last == channels):
        return x if first == channels else x.transpose(0, 3, 1, 2)
    if last in (1, 3) and first not in (1, 3):
        return x.transpose(0, 3, 1, 2)
    if first in (1, 3, 4) or channels is not None:
        return x
    raise ClientDataError(f"{where}: x has shape {list(x.shape)}: no axis of 1 or 3 channels "
                          "next to the image's height and width")


def pixel_array(x: np.ndarray, shape: Sequence[int], resize: bool, where: str,
                convert: bool = False) -> np.ndarray:
    """Pixels of an ``.npz`` as uint8 (N, C, H, W) of the task's ``shape``: integers 0..255
    only; channels converted (through Pillow, as image files are) and sizes resized or
    refused as for files."""
    if x.dtype.kind not in "ui":
        raise ClientDataError(f"{where}: x is {x.dtype}; image pixels must be integers 0..255 "
                              "(uint8)")
    if x.size and (x.min() < 0 or x.max() > 255):
        raise ClientDataError(f"{where}: x has pixel values {x.min()}..{x.max()}, outside "
                              "0..255")
    c, h, w = (int(v) for v in shape)
    chw = nchw_layout(x, where, c)
    if chw.shape[1:] == (c, h, w):
        return np.ascontiguousarray(chw, dtype=np.uint8)
    if chw.shape[1] not in MODES:
        raise ClientDataError(f"{where}: x has shape {list(x.shape)}, the task's input-shape "
                              f"is {[c, h, w]}", "shape-mismatch", len(x))
    if chw.shape[1] != c:
        if not convert:
            raise ClientDataError(f"{where}: x has {chw.shape[1]} channels per image, the "
                                  f"task's input-shape has {c} (set convert = true in the "
                                  "task to convert)", "channel-mismatch", len(x))
        log_converted(where, len(x), c)
    if chw.shape[2:] != (h, w) and not resize:
        raise ClientDataError(f"{where}: x holds {chw.shape[3]}×{chw.shape[2]} images, the "
                              f"task's input-shape is {w}×{h} (W×H; set resize = true in the "
                              "task to resize)", "shape-mismatch", len(x))
    from PIL import Image

    out = np.empty((len(chw), c, h, w), dtype=np.uint8)
    for start in range(0, len(chw), _CHUNK):
        block = chw[start:start + _CHUNK].astype(np.uint8)
        for j, img in enumerate(block):
            pil = Image.fromarray(img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0))
            out[start + j] = pil_to_chw(pil, shape, resize, f"{where}, image {start + j}",
                                        convert)
    return out


__all__ = ["GREY_MODES", "IMAGE_SUFFIXES", "MAX_IMAGE_PIXELS", "MODES", "check_headers",
           "decode_files", "decode_pils", "has_class_folders", "header", "image_parts",
           "is_image", "list_class_folders", "log_converted", "mode_channels", "nchw_layout",
           "pil_to_chw", "pixel_array", "split_folders", "visible"]
