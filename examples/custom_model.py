"""A model given by import path: ``model = "examples.custom_model:factory"`` in a task file
(run from the repository root, where ``examples`` imports).

FedCure averages every parameter of the model, so the model keeps state in parameters only
(no dropout randomness, no batch-norm running statistics).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def factory(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Images (C, H, W): two 3×3 conv blocks (ReLU, 2×2 max-pool), an average pool to 4×4 and
    two linear layers; feature rows (F,): a 32-unit two-layer perceptron."""
    shape = [int(v) for v in input_shape]
    if len(shape) == 1:
        return nn.Sequential(nn.Linear(shape[0], 32), nn.Tanh(), nn.Linear(32, num_classes))
    channels = shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes))
