"""The task file (``task.toml``): a user's own learning task, the one description every role
shares.

``[task]`` names the kind of data (``image`` or ``tabular``), the class list in label order
(every client maps its labels to it by name, so two clients holding different class subsets
agree on every shared class's index), the input shape or feature count, the per-channel or
per-feature normalisation and the model (a built-in name or an import path
``package.module:factory``). Pydantic only (no NumPy): the client role imports it.
"""

from __future__ import annotations

import math
import re
import tomllib
import unicodedata
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


#: Built-in models a task may name (``fedcure_app.models.TASK_MODELS``): the paper's CNNs
#: (which fix the input shape), a small CNN for any image size and an MLP.
BUILTIN_TASK_MODELS: tuple[str, ...] = ("digits", "mnist", "cifar10", "cnn", "mlp")
#: The input shape each of the paper's CNNs takes (C, H, W).
PAPER_CNN_SHAPES: dict[str, tuple[int, int, int]] = {
    "digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
TaskKind = Literal["image", "tabular"]
#: The most values one sample may hold (C·H·W of an image, F of a table row): a 1024×1024 RGB
#: image. A client holds its samples in memory, and the built-in models' first layer grows
#: with the input.
MAX_INPUT_VALUES = 3 * 1024 * 1024
#: The largest finite float32 (the normalised data and the model are float32).
FLOAT32_MAX = 3.4028234663852886e38
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def _printable(name: str) -> bool:
    """No control, format, surrogate or unassigned characters (Unicode categories C*)."""
    return bool(name) and not any(unicodedata.category(ch).startswith("C") for ch in name)


def _check_float32_range(mean: tuple[float, ...], std: tuple[float, ...], pixels: bool) -> None:
    """Every normalisation constant and the normalised range representable in float32: mean,
    std, 1/std and mean/std (x·(1/std) − mean/std, :func:`fedcure_app.data.own.pixel_norm`),
    and for images (pixels on [0, 1]) (1 − mean)/std too."""
    for i, (m, s) in enumerate(zip(mean, std)):
        ends = [abs(m), s, 1.0 / s, abs(m) / s] + ([abs(1.0 - m) / s] if pixels else [])
        if not all(v <= FLOAT32_MAX for v in ends):
            raise ValueError(f"mean[{i}] = {m:g} with std[{i}] = {s:g}: the normalised data "
                             f"(x − mean)/std is not representable in float32 (|values| "
                             f"beyond {FLOAT32_MAX:.3g})")


class TaskConfig(BaseModel):
    """A user's own learning task: ``[task]`` of a task file (``task.toml``), handed by the
    cloud to every role. It fixes what every client maps its data to: the class list (label
    order), the input shape, the normalisation and the model."""

    model_config = ConfigDict(alias_generator=lambda n: n.replace("_", "-"),
                              populate_by_name=True, extra="forbid")

    kind: TaskKind = Field("image", description="image (class folders, npz images) or tabular "
                           "(CSV or npz feature rows)")
    classes: list[str] = Field(min_length=2, max_length=100_000, description="class names in "
                               "label order: every client maps its labels to these by name")
    input_shape: list[Annotated[int, Field(ge=1, le=65_536)]] | None = Field(
        None, min_length=3, max_length=3, description="[C, H, W] of one image (kind image)")
    features: int | None = Field(None, ge=1, le=MAX_INPUT_VALUES,
                                 description="feature columns per row (kind tabular)")
    model: str = Field("", description="a built-in model (digits, mnist, cifar10: the paper's "
                       "CNNs; cnn: a small CNN for any image size; mlp) or an import path "
                       "package.module:factory, factory(input_shape, num_classes) -> "
                       "torch.nn.Module; empty: cnn for images, mlp for tables")
    mean: list[Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None, description="per channel (images, on the [0, 1] pixel scale) or per feature; "
        "empty: 0")
    std: list[Annotated[float, Field(gt=0.0, allow_inf_nan=False)]] | None = Field(
        None, description="per channel or per feature, > 0; empty: 1")
    resize: bool = Field(False, description="resize images of another size to input-shape's "
                         "H×W (bilinear) instead of refusing them")
    convert: bool = Field(False, description="convert images of other channels than "
                          "input-shape's C (greyscale <-> RGB) instead of refusing them")

    @model_validator(mode="after")
    def _consistent(self) -> "TaskConfig":
        bad = [c for c in self.classes if not _printable(c) or len(c) > 128]
        if bad:
            raise ValueError(f"class name {bad[0]!r} is not a printable name of 1..128 "
                             "characters")
        seen: set[str] = set()
        for c in self.classes:  # linear: a class list may be long
            if c in seen:
                raise ValueError(f"class {c!r} is listed twice")
            seen.add(c)
        if self.kind == "image":
            if self.input_shape is None or self.features is not None:
                raise ValueError("an image task needs input-shape = [C, H, W] and no features")
            width = self.input_shape[0]
        else:
            if (self.features is None or self.input_shape is not None or self.resize
                    or self.convert):
                raise ValueError("a tabular task needs features = F and no input-shape, "
                                 "resize or convert")
            width = self.features
        size = math.prod(self.sample_shape)
        if size > MAX_INPUT_VALUES:
            raise ValueError(f"one sample of {list(self.sample_shape)} holds {size:,} values, "
                             f"at most {MAX_INPUT_VALUES:,} (a 1024×1024 RGB image)")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and len(values) != width:
                raise ValueError(f"{name} has {len(values)} values, the task has {width} "
                                 f"{'channels' if self.kind == 'image' else 'features'}")
        _check_float32_range(self.mean_values, self.std_values, self.kind == "image")
        if not self.model:
            self.model = "cnn" if self.kind == "image" else "mlp"
        if self.model in PAPER_CNN_SHAPES:
            want = PAPER_CNN_SHAPES[self.model]
            if self.kind != "image" or tuple(self.input_shape or ()) != want:
                raise ValueError(f"model {self.model} takes images of shape "
                                 f"{list(want)}, the task has "
                                 f"{self.input_shape or [self.features]}")
        elif self.model == "cnn" and self.kind != "image":
            raise ValueError("model cnn takes images; a tabular task uses mlp or an import path")
        elif self.model not in BUILTIN_TASK_MODELS and not _IMPORT_PATH.match(self.model):
            raise ValueError(f"model {self.model!r} is neither a built-in model ("
                             f"{', '.join(BUILTIN_TASK_MODELS)}) nor an import path "
                             "package.module:factory")
        return self

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """(C, H, W) of an image task, (F,) of a tabular one."""
        if self.kind == "image":
            return tuple(self.input_shape or ())
        return (int(self.features or 0),)

    @property
    def mean_values(self) -> tuple[float, ...]:
        """``mean``, or zeros."""
        return tuple(self.mean) if self.mean is not None else (0.0,) * self.sample_shape[0]

    @property
    def std_values(self) -> tuple[float, ...]:
        """``std``, or ones."""
        return tuple(self.std) if self.std is not None else (1.0,) * self.sample_shape[0]


class TaskFileError(ValueError):
    """A task file that is missing or invalid (one line naming the file and the key)."""


def parse_task(data: dict, source: str = "task") -> TaskConfig:
    """Validate a ``[task]`` mapping (hyphenated or snake_case keys); :class:`TaskFileError`
    in one line naming the key at fault."""
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(x) for x in e["loc"])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            msg = msg.removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        raise TaskFileError(f"{source}: " + "; ".join(parts)) from None


def load_task(path: str | Path) -> TaskConfig:
    """Read a task file: TOML with a ``[task]`` table (or JSON with a ``task`` object)."""
    import json

    p = Path(path)
    if not p.is_file():
        raise TaskFileError(f"task file not found: {p}")
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise TaskFileError(f"cannot read task file {p}: {err}") from None
    if not isinstance(data.get("task"), dict):
        raise TaskFileError(f"{p}: no [task] table")
    return parse_task(data["task"], str(p))


def task_toml(task: TaskConfig) -> str:
    """``task`` as the text of a task file (``[task]``, hyphenated keys, None left out)."""
    import json

    lines = ["[task]"]
    for key, value in task.model_dump(by_alias=True, exclude_none=True).items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        else:  # str, int, float and lists of them are valid TOML written as JSON
            text = json.dumps(value, ensure_ascii=False)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


__all__ = ["BUILTIN_TASK_MODELS", "FLOAT32_MAX", "MAX_INPUT_VALUES", "PAPER_CNN_SHAPES",
           "TaskConfig", "TaskFileError", "load_task", "parse_task", "task_toml"]
