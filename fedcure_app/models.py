"""The paper's CNNs, and moving their weights in and out as numpy arrays.

Architectures (inputs are NCHW float32):

- ``digits`` (1×8×8, scikit-learn digits): conv 1→16 3×3 (pad 1), pool 2, conv 16→32 3×3 (pad 1),
  pool 2, fc 128→10.
- ``mnist`` (1×28×28): conv 1→32 5×5, pool 2, conv 32→64 5×5, pool 2, fc 1024→10
  (two conv, two pooling, one fully connected layer, as in the paper).
- ``cifar10`` / ``svhn`` / ``cinic10`` (3×32×32): conv 3→32 5×5, conv 32→64 5×5, pool 2,
  fc 9216→128→64→10 (two conv, one pooling, three fully connected layers, as in the paper).

No layer is stochastic (no dropout, no batch norm), so training is a deterministic function of
the initial weights and the batch order.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from fedcure_app.data.task import TaskConfig

#: Input shape (C, H, W) of each dataset's samples.
INPUT_SHAPES: dict[str, tuple[int, int, int]] = {
    "digits": (1, 8, 8),
    "mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "svhn": (3, 32, 32),
    "cinic10": (3, 32, 32),
}

#: The architecture each dataset uses (the three 3×32×32 datasets share one).
ARCHITECTURES: dict[str, str] = {
    "digits": "digits",
    "mnist": "mnist",
    "cifar10": "cifar10",
    "svhn": "cifar10",
    "cinic10": "cifar10",
}


class DigitsCNN(nn.Sequential):
    """Small CNN for 1×8×8 inputs: two 3×3 conv + pool blocks and one linear layer."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8 -> 4
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4 -> 2
            nn.Flatten(),
            nn.Linear(32 * 2 * 2, num_classes),
        )


class MnistCNN(nn.Sequential):
    """The paper's MNIST CNN: two 5×5 conv layers, two 2×2 max-pools, one linear layer."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(
            nn.Conv2d(1, 32, kernel_size=5),  # 28 -> 24
            nn.ReLU(),
            nn.MaxPool2d(2),  # 24 -> 12
            nn.Conv2d(32, 64, kernel_size=5),  # 12 -> 8
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8 -> 4
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, num_classes),
        )


class Cifar10CNN(nn.Sequential):
    """The paper's 3×32×32 CNN: two 5×5 conv layers, one 2×2 max-pool, three linear layers."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(
            nn.Conv2d(3, 32, kernel_size=5),  # 32 -> 28
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=5),  # 28 -> 24
            nn.ReLU(),
            nn.MaxPool2d(2),  # 24 -> 12
            nn.Flatten(),
            nn.Linear(64 * 12 * 12, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )


_BUILDERS: dict[str, type[nn.Module]] = {
    "digits": DigitsCNN,
    "mnist": MnistCNN,
    "cifar10": Cifar10CNN,
}


class SmallCNN(nn.Sequential):
    """A small CNN for images of any size (C×H×W): two 3×3 conv (pad 1) + ReLU blocks, each
    followed by a 2×2 max-pool while the side is at least 2, and one linear layer."""

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        c, h, w = (int(v) for v in input_shape)
        layers: list[nn.Module] = []
        for c_in, c_out in ((c, 16), (16, 32)):
            layers += [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.ReLU()]
            if h >= 2 and w >= 2:
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
        super().__init__(*layers, nn.Flatten(), nn.Linear(32 * h * w, num_classes))


class MLP(nn.Sequential):
    """A multilayer perceptron for feature rows (or flattened images): prod(input_shape) → 64
    → 64 → classes, ReLU between."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: int = 64) -> None:
        width = int(np.prod([int(v) for v in input_shape]))
        super().__init__(nn.Flatten(), nn.Linear(width, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class ModelImportError(ValueError):
    """A task's model import path that does not import or does not build a model (one line)."""


def import_factory(path: str) -> object:
    """The callable named by ``package.module:factory`` (imported here). The working folder
    is searched only where the entry point trusts it (the user's own task:
    :func:`fedcure_app.data.model_consent.trust_working_folder`), never on a client."""
    import os
    import sys

    from fedcure_app.data.model_consent import working_folder_trusted

    module_name, _, attr = path.partition(":")
    top = module_name.split(".")[0]
    if (working_folder_trusted() and importlib.util.find_spec(top) is None
            and os.getcwd() not in sys.path):
        # as `python -m` would: a module beside the user's working folder (console scripts
        # such as `fedcure` leave the working folder off sys.path)
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - a user's module may raise anything on import
        raise ModelImportError(f"model {path}: cannot import {module_name} "
                               f"({type(err).__name__}: {err})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelImportError(f"model {path}: {module_name} has no callable {attr}")
    return factory


def build_task_model(task: TaskConfig) -> nn.Module:
    """The model of a user's task (:class:`fedcure_app.data.task.TaskConfig`): one of the
    paper's CNNs, :class:`SmallCNN`, :class:`MLP`, or ``factory(input_shape, num_classes)``
    from the task's import path. Raises :class:`ModelImportError` when the path does not
    import or its factory does not return a ``torch.nn.Module`` of float32 parameters."""
    shape, n = tuple(task.sample_shape), task.num_classes
    if task.model in _BUILDERS:
        return _BUILDERS[task.model](n)
    if task.model == "cnn":
        return SmallCNN(shape, n)
    if task.model == "mlp":
        return MLP(shape, n)
    factory = import_factory(task.model)
    try:
        model = factory(shape, n)  # type: ignore[operator]
    except Exception as err:  # noqa: BLE001 - a user's factory may raise anything
        raise ModelImportError(f"model {task.model}: factory({shape}, {n}) raised "
                               f"{type(err).__name__}: {err}") from None
    if not isinstance(model, nn.Module):
        raise ModelImportError(f"model {task.model}: factory returned "
                               f"{type(model).__name__}, not a torch.nn.Module")
    bad = [k for k, t in model.state_dict().items() if t.dtype != torch.float32]
    if bad:
        raise ModelImportError(f"model {task.model}: tensor {bad[0]} is not float32")
    return model


#: The most parameters a task's model may have: 50 million (200 MB of float32; a client holds
#: the model, its gradients and the optimiser's state).
MAX_MODEL_PARAMETERS = 50_000_000


def check_task_model(task: TaskConfig) -> int:
    """The parameters of the task's model, counted on torch's ``meta`` device (nothing is
    allocated). :class:`ModelImportError` in one line when the model cannot be built or has
    more than :data:`MAX_MODEL_PARAMETERS`: what the cloud checks at start
    (``fedcure-cloud --task``) and a client before it reads its data."""
    try:
        with torch.device("meta"):
            model = build_task_model(task)
    except ModelImportError:
        raise
    except Exception as err:  # noqa: BLE001 - a built-in model of an absurd shape, say
        raise ModelImportError(f"model {task.model} for input {list(task.sample_shape)} and "
                               f"{task.num_classes} classes cannot be built "
                               f"({type(err).__name__}: {' '.join(str(err).split())[:200]})"
                               ) from None
    count = sum(int(t.numel()) for t in model.state_dict().values())
    if count > MAX_MODEL_PARAMETERS:
        raise ModelImportError(f"model {task.model} for input {list(task.sample_shape)} and "
                               f"{task.num_classes} classes has {count:,} parameters, at most "
                               f"{MAX_MODEL_PARAMETERS:,}")
    return count


def model_signature(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every state tensor in ``state_dict`` order: what two roles compare to
    know they hold the same model (a client's against the cloud's, at registration)."""
    return [(k, tuple(t.shape)) for k, t in model.state_dict().items()]


def build_model(dataset: str | TaskConfig, num_classes: int = 10) -> nn.Module:
    """Build the CNN for ``dataset`` (digits, mnist, cifar10, svhn, cinic10), on the CPU, float32,
    or the model of a user's task when ``dataset`` is a :class:`~fedcure_app.data.task.
    TaskConfig` (:func:`build_task_model`; ``num_classes`` is the task's then).

    Initial weights come from torch's global RNG: seed it (``torch.manual_seed``) for a
    reproducible start, or copy weights from another model with :func:`set_weights`.
    """
    if not isinstance(dataset, str):
        return build_task_model(dataset)
    key = dataset.lower()
    if key not in ARCHITECTURES:
        raise ValueError(
            f"unknown dataset {dataset!r}; choose one of {', '.join(ARCHITECTURES)}"
        )
    if int(num_classes) != num_classes or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return _BUILDERS[ARCHITECTURES[key]](int(num_classes))


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """The model's state (parameters and buffers) as numpy arrays, in ``state_dict`` order.

    The arrays are copies: later training does not change them.
    """
    return [t.detach().cpu().numpy().copy() for t in model.state_dict().values()]


def weight_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The shapes of the model's state tensors, in ``state_dict`` order (what
    :func:`get_weights` returns and :func:`set_weights` takes)."""
    return [tuple(t.shape) for t in model.state_dict().values()]


def set_weights(model: nn.Module, arrays: Sequence[np.ndarray]) -> None:
    """Load numpy arrays into the model's state, in ``state_dict`` order, in place.

    Raises ``ValueError`` naming the first entry whose count or shape does not match; nothing is
    changed in that case. Values are cast to each tensor's dtype.
    """
    state = model.state_dict()
    if len(arrays) != len(state):
        raise ValueError(
            f"set_weights: got {len(arrays)} arrays but the model has {len(state)} tensors "
            f"({', '.join(state)})"
        )
    for (name, tensor), arr in zip(state.items(), arrays):
        shape = tuple(np.shape(arr))
        if shape != tuple(tensor.shape):
            raise ValueError(
                f"set_weights: shape mismatch for {name!r}: model has {tuple(tensor.shape)}, "
                f"got {shape}"
            )
    with torch.no_grad():
        for tensor, arr in zip(state.values(), arrays):
            tensor.copy_(torch.as_tensor(np.asarray(arr)))


def model_num_params(model: nn.Module) -> int:
    """Number of trainable parameters (scalars)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def model_num_bytes(model: nn.Module) -> int:
    """Size of the model's state (parameters and buffers) in bytes, as sent over the network."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def forward_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Floating-point operations (multiply and add counted separately) of one sample's forward pass.

    Counts convolutions and linear layers (2·MACs plus the bias adds); activations and pooling
    are ignored (under 1 % for these models). ``input_shape`` is (C, H, W) without the batch.
    """
    total = 0

    def conv_hook(mod: nn.Conv2d, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal total
        k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        outs = out.numel() // out.shape[0]
        total += outs * (2 * k - 1 + (1 if mod.bias is not None else 0))

    def linear_hook(mod: nn.Linear, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal total
        outs = out.numel() // out.shape[0]
        total += outs * (2 * mod.in_features - 1 + (1 if mod.bias is not None else 0))

    handles = []
    for mod in model.modules():
        if isinstance(mod, nn.Conv2d):
            handles.append(mod.register_forward_hook(conv_hook))
        elif isinstance(mod, nn.Linear):
            handles.append(mod.register_forward_hook(linear_hook))
    try:
        with torch.inference_mode():
            model(torch.zeros((1, *input_shape)))
    finally:
        for h in handles:
            h.remove()
    return total


def train_flops_per_sample(dataset: str | TaskConfig) -> int:
    """FLOPs of one training sample (forward + backward ≈ 3 × forward) for ``dataset``'s CNN,
    or a user task's model."""
    if not isinstance(dataset, str):
        return 3 * forward_flops(build_task_model(dataset), tuple(dataset.sample_shape))
    key = dataset.lower()
    model = build_model(key)
    return 3 * forward_flops(model, INPUT_SHAPES[key])


def cycles_key(dataset: str | TaskConfig) -> str:
    """The key a device profile's cycles per sample are looked up by: the dataset's name, or
    ``flops:N`` for a task's model (N: its training FLOPs per sample;
    :meth:`fedcure_app.devices.DeviceProfile.cycles_for` scales a known model's cycles by it)."""
    if isinstance(dataset, str):
        return dataset
    return f"flops:{max(1, train_flops_per_sample(dataset))}"
