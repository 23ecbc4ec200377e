"""Norm screen: refuse an edge model far outside the others before it reaches the global model.

The distance of an edge model ω_m from the current global model ω is the L2 norm over every
tensor, ‖ω_m − ω‖ (float64). The screen remembers the distances of the last ``window`` accepted
models; once it holds ``min_history`` of them it refuses a model whose distance exceeds
``factor`` × their median (a model ``factor`` times farther than a typical one). Before that it
accepts every finite model. Pure numpy; the cloud calls :meth:`NormScreen.check` before
aggregating and :meth:`NormScreen.accept` after.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np


def distance(arrays: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """‖arrays − reference‖₂ over all tensors (float64)."""
    total = 0.0
    for a, r in zip(arrays, reference):
        d = np.asarray(a, dtype=np.float64) - np.asarray(r, dtype=np.float64)
        total += float(np.dot(d.ravel(), d.ravel()))
    return float(np.sqrt(total))


class NormScreen:
    """Median-based outlier screen over recent accepted distances (see the module docstring)."""

    def __init__(self, factor: float = 10.0, window: int = 20, min_history: int = 3) -> None:
        if not factor > 1.0:
            raise ValueError(f"norm factor must be > 1, got {factor}")
        if window < 1 or min_history < 1:
            raise ValueError("norm window and min history must be >= 1")
        self.factor = float(factor)
        self.window = int(window)
        self.min_history = int(min_history)
        self.history: deque[float] = deque(maxlen=self.window)

    def limit(self) -> float | None:
        """The largest distance accepted now (None: no limit yet)."""
        if len(self.history) < self.min_history:
            return None
        return self.factor * float(np.median(np.asarray(self.history)))

    def check(self, dist: float) -> str | None:
        """None when a model at distance ``dist`` passes; else a one-line reason."""
        if not np.isfinite(dist):
            return "edge model is at a non-finite distance from the global model"
        lim = self.limit()
        if lim is not None and dist > lim:
            return (f"edge model is {dist:.4g} from the global model, more than {self.factor:g}× "
                    f"the median {lim / self.factor:.4g} of the last {len(self.history)} accepted")
        return None

    def accept(self, dist: float) -> None:
        """Remember the distance of an accepted model."""
        self.history.append(float(dist))

    def state_dict(self) -> dict[str, Any]:
        """The screen's settings and distance history, for the checkpoint."""
        return {"factor": self.factor, "window": self.window, "min_history": self.min_history,
                "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the distance history written by :meth:`state_dict`."""
        self.history = deque((float(x) for x in state["history"]), maxlen=self.window)
