"""The trained model as a program that needs neither FedCure nor its normalisation:
:class:`NormalisedModel` puts the task's normalisation in front of the task's model, and
:func:`export_program` / :func:`write_export` turn it into a ``torch.export`` program
(``.pt2``), TorchScript or ONNX.

Input: float32 N×C×H×W pixels in [0, 1] for an image task (pixel / 255, or / 16 for the
built-in scikit-learn digits), N×F raw feature values for a tabular one; output: N×classes
logits in the task's class order. The normalisation is the training's, (x − mean)/std per
channel or feature (``fedcure_app.data.own.normalise_x``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

#: what ``fedcure model export --format`` writes
EXPORT_FORMATS: tuple[str, ...] = ("pt2", "onnx", "torchscript")


class ExportError(ValueError):
    """The model cannot be written in the asked format (one line)."""


class NormalisedModel(nn.Module):
    """``model((x − mean) / std)``, mean and std per channel (images, on the [0, 1] pixel
    scale) or per feature (tables), kept as buffers so they travel with the program."""

    def __init__(self, model: nn.Module, task: Any) -> None:
        super().__init__()
        self.model = model
        view = (1, -1, 1, 1) if task.kind == "image" else (1, -1)
        self.register_buffer("mean", torch.tensor(task.mean_values, dtype=torch.float32)
                             .view(view))
        self.register_buffer("std", torch.tensor(task.std_values, dtype=torch.float32)
                             .view(view))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)


def example_input(task: Any, batch: int = 2) -> torch.Tensor:
    """A float32 batch of the task's input shape (zeros)."""
    return torch.zeros((batch, *task.sample_shape), dtype=torch.float32)


def export_program(module: NormalisedModel, task: Any) -> Any:
    """``torch.export`` program of ``module`` with a dynamic batch dimension."""
    from torch.export import Dim, export

    module.eval()
    batch = Dim("batch", min=1, max=1 << 20)
    return export(module, (example_input(task),), dynamic_shapes=({0: batch},))


def write_export(module: NormalisedModel, task: Any, fmt: str, out: str | Path) -> Path:
    """Write ``module`` to ``out`` as ``fmt`` (:data:`EXPORT_FORMATS`); :class:`ExportError`
    in one line when the format's tools are missing or the model cannot be traced."""
    out = Path(out)
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"--format {fmt}: one of {', '.join(EXPORT_FORMATS)}")
    module.eval()
    try:
        if fmt == "pt2":
            torch.export.save(export_program(module, task), str(out))
        elif fmt == "torchscript":
            with torch.no_grad():
                traced = torch.jit.trace(module, (example_input(task),))
            traced.save(str(out))
        else:
            _export_onnx(module, task, out)
    except ExportError:
        raise
    except Exception as err:  # noqa: BLE001 - a user's model may not trace
        raise ExportError(f"cannot export the model as {fmt}: {type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]}") from None
    return out


def _export_onnx(module: NormalisedModel, task: Any, out: Path) -> None:
    import importlib.util

    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(f"--format onnx needs {' and '.join(missing)}: pip install "
                          "'fedcure[onnx]'")
    import logging
    import warnings

    # the exporter's own chatter (progress lines, torchvision ops it skips, deprecations of
    # torch internals) is not the user's business; an export that fails still raises
    chatter = logging.getLogger("torch.onnx")
    level = chatter.level
    chatter.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.onnx.export(module, (example_input(task),), str(out), input_names=["x"],
                              output_names=["logits"], dynamic_shapes=({0: "batch"},),
                              dynamo=True, verbose=False)
    finally:
        chatter.setLevel(level)


__all__ = ["EXPORT_FORMATS", "ExportError", "NormalisedModel", "example_input",
           "export_program", "write_export"]
