"""Which of the equivalent batched forwards trains a coalition fastest, measured on the device.

The batched executor's GPU path can compute its K clients' convolutions three ways, all the same
function of the same stacked parameters (:mod:`~fedcure_app.simulation.forwards`):

- ``grouped``: one grouped convolution over the clients' channel blocks (NCHW);
- ``grouped-nhwc``: the same in channels-last layout (cuDNN's NHWC kernels);
- ``im2col``: ``F.unfold`` and batched matrix products, weight gradient included.

Which is fastest depends on the card, the cuDNN version and the layer shapes (cuDNN's grouped
weight gradient is slow for some shapes), so the executor times them once, on its first edge
round, and keeps the fastest: the way ``torch.backends.cudnn.benchmark`` picks a convolution
algorithm. A path whose edge round differs from the reference path's by more than a tolerance,
or that fails (out of memory, say), is not used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from fedcure_app.simulation.forwards import Forward, grouped_forward, im2col_forward

#: The convolution paths, the reference first.
CONV_PATHS: tuple[str, ...] = ("grouped", "grouped-nhwc", "im2col")

#: Largest accepted difference (max abs, any parameter) of a path's edge round from the
#: reference path's: the smoke test's bound for the batched executor against the one-by-one one.
TOLERANCE = 1e-3


def conv_forwards(model: nn.Module) -> dict[str, Forward]:
    """The batched forwards ``model`` has, by path name in :data:`CONV_PATHS` order (empty when
    it is not a CNN :func:`~fedcure_app.simulation.forwards.grouped_forward` can group)."""
    made = {"grouped": grouped_forward(model),
            "grouped-nhwc": grouped_forward(model, channels_last=True),
            "im2col": im2col_forward(model)}
    if made["grouped"] is None:
        return {}
    return {name: f for name, f in made.items() if f is not None}


@dataclass(frozen=True)
class Choice:
    """The path :func:`pick_fastest` chose, each path's best time (seconds per call) and why a
    path was not timed."""

    path: str
    seconds: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The choice as JSON: path, seconds per path, rejected paths and why."""
        return {"path": self.path, "seconds": dict(self.seconds), "rejected": dict(self.rejected)}

    def describe(self) -> str:
        """One line: the chosen path and every path's time or reason."""
        parts = [f"{name} {1000 * s:.2f} ms" for name, s in self.seconds.items()]
        parts += [f"{name} not used ({why})" for name, why in self.rejected.items()]
        return f"{self.path} ({', '.join(parts)})"


def _max_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    if len(a) != len(b):
        return math.inf
    return max((float((x.float() - y.float()).abs().max()) for x, y in zip(a, b)), default=0.0)


def pick_fastest(candidates: Mapping[str, Callable[[], Sequence[torch.Tensor]]], *,
                 repeats: int = 3, tolerance: float = TOLERANCE,
                 clock: Callable[[], float] = time.perf_counter,
                 sync: Callable[[], None] = lambda: None) -> Choice:
    """Time every candidate (a call computing the same tensors) ``repeats`` times, interleaved,
    and choose the fastest by its best time; ties go to the earlier candidate.

    The first candidate is the reference: its failure is raised. Another candidate that raises,
    or whose tensors differ from the reference's by more than ``tolerance`` (max abs), is
    rejected. ``sync`` waits for the device (``torch.cuda.synchronize``) before each clock
    reading.
    """
    if not candidates:
        raise ValueError("pick_fastest needs at least one candidate")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(candidates)
    reference = [t.detach().clone() for t in candidates[names[0]]()]
    usable, rejected = [names[0]], {}
    for name in names[1:]:
        try:
            diff = _max_diff(reference, candidates[name]())
        except Exception as err:  # noqa: BLE001 - any failure rules the path out, not the run
            rejected[name] = f"{type(err).__name__}: {err}".splitlines()[0][:120]
            continue
        if not diff <= tolerance:
            rejected[name] = f"differs by {diff:.1e}"
        else:
            usable.append(name)
    best = {name: math.inf for name in usable}
    for _ in range(repeats):
        for name in usable:
            sync()
            t0 = clock()
            candidates[name]()
            sync()
            best[name] = min(best[name], clock() - t0)
    chosen = min(usable, key=lambda n: (best[n], usable.index(n)))
    return Choice(chosen, best, rejected)


def cuda_sync(device: torch.device) -> Callable[[], None]:
    """A ``sync`` for :func:`pick_fastest`: wait for ``device`` when it is a GPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


__all__ = ["CONV_PATHS", "Choice", "TOLERANCE", "conv_forwards", "cuda_sync", "pick_fastest"]
