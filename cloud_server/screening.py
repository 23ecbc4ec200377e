"""Norm screen: refuse an edge model far outside what training can produce, from the first one.

The distance of an edge model ω_m from the model ω its task started from (the global model of
the task's version: ``cloud_server.arrivals.base_arrays``) is the L2 norm over every tensor,
‖ω_m − ω‖ (float64). :class:`NormScreen` refuses a model whose distance is not finite or
exceeds its limit

    limit = min(cap, max(FLOOR_SHARE·cap, factor × median(history)))  (≥ min_history)
    limit = cap                                                        (before that)

- ``cap``, the step bound: a task is τ_e edge rounds of FedAvg over clients that each take τ_c
  plain SGD steps at learning rate lr, so its edge model lies within lr·τ_c·τ_e·G of the model
  the task started from when no mini-batch gradient is longer than G (``norm-grad-bound``,
  :func:`step_bound`). It holds from the first update: a fresh cloud has no cold start.
- ``history``: the distances of the last ``window`` accepted models, each clipped to
  ``growth`` × the history's median as it enters; the median is the lower one (an element,
  the ⌈n/2⌉-th smallest). Refused models never enter it. At least ⌈n/2⌉ entries lie at or
  under the median, so adding one entry of at most growth × median (and dropping the oldest)
  leaves at least ⌈n/2⌉ entries at or under growth × median: one accepted update moves the
  median, and with it the limit, up by at most the factor ``growth``; the cap never moves.
- ``FLOOR_SHARE``·cap: the limit never falls below 1 % of the step bound, so edges answering
  the global model back unchanged (distance 0) cannot shrink the limit until every real update
  is refused.

Pure numpy; the cloud calls :meth:`NormScreen.check` before aggregating and
:meth:`NormScreen.accept` after, and checkpoints :meth:`~NormScreen.state_dict`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig

log = logging.getLogger("fedcure.cloud")

#: the limit's floor, as a share of the step bound
FLOOR_SHARE = 0.01


def distance(arrays: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """‖arrays − reference‖₂ over all tensors (float64; inf when the sum overflows)."""
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for a, r in zip(arrays, reference):
            d = np.asarray(a, dtype=np.float64) - np.asarray(r, dtype=np.float64)
            total += float(np.dot(d.ravel(), d.ravel()))
    return float(np.sqrt(total)) if math.isfinite(total) else math.inf


def step_bound(cfg: FedCureConfig) -> float:
    """lr·τ_c·τ_e·G: the farthest (L2) a task's plain SGD steps move a model when no
    mini-batch gradient is longer than G = ``reliability.norm_grad_bound``."""
    m = cfg.method
    return m.lr * m.tau_c * m.tau_e * cfg.reliability.norm_grad_bound


def lower_median(values: Sequence[float]) -> float:
    """The ⌈n/2⌉-th smallest of ``values`` (n ≥ 1): a median that is one of them."""
    ordered = sorted(values)
    return float(ordered[(len(ordered) - 1) // 2])


class NormScreen:
    """Step-bounded, median-based outlier screen over accepted distances (module docstring).

    ``cap``: the step bound (model-space L2 units, :func:`step_bound`); ``factor``: the
    limit's multiple of the median; ``window``: accepted distances remembered;
    ``min_history``: entries before the median acts; ``growth``: an entry's clip, as a
    multiple of the median."""

    def __init__(self, cap: float, factor: float = 10.0, window: int = 20,
                 min_history: int = 3, growth: float = 2.0) -> None:
        if not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"norm cap must be finite and > 0, got {cap}")
        if not factor > 1.0:
            raise ValueError(f"norm factor must be > 1, got {factor}")
        if not (math.isfinite(growth) and growth >= 1.0):
            raise ValueError(f"norm growth must be finite and >= 1, got {growth}")
        if window < 1 or min_history < 1:
            raise ValueError("norm window and min history must be >= 1")
        self.cap = float(cap)
        self.factor = float(factor)
        self.window = int(window)
        self.min_history = int(min_history)
        self.growth = float(growth)
        self.history: deque[float] = deque(maxlen=self.window)

    @classmethod
    def from_config(cls, cfg: FedCureConfig) -> "NormScreen":
        """The screen the configuration describes (``[reliability]`` norm-* knobs)."""
        rel = cfg.reliability
        return cls(step_bound(cfg), rel.norm_factor, rel.norm_window, rel.norm_min_history,
                   rel.norm_growth)

    @property
    def floor(self) -> float:
        """The lowest the limit goes (:data:`FLOOR_SHARE` × cap)."""
        return FLOOR_SHARE * self.cap

    def limit(self) -> float:
        """The largest distance accepted now (model-space L2 units)."""
        if len(self.history) < self.min_history:
            return self.cap
        return min(self.cap, max(self.floor, self.factor * lower_median(self.history)))

    def check(self, dist: float) -> str | None:
        """None when a model at distance ``dist`` passes; else a one-line reason."""
        if not math.isfinite(dist):
            return "edge model is at a non-finite distance from the model its task started from"
        if dist > self.cap:
            return (f"edge model is {dist:.4g} from its task's model, beyond the step bound "
                    f"{self.cap:.4g} (lr·τ_c·τ_e·norm-grad-bound: the farthest a task's SGD "
                    "steps move it)")
        lim = self.limit()
        if dist > lim:
            return (f"edge model is {dist:.4g} from its task's model, beyond the limit "
                    f"{lim:.4g} ({self.factor:g}× the median "
                    f"{lower_median(self.history):.4g} of the last {len(self.history)} "
                    "accepted)")
        return None

    def accept(self, dist: float) -> None:
        """Remember the distance of an accepted model, clipped to ``growth`` × the median.
        Raises ``ValueError`` for a distance :meth:`check` refuses (it never enters)."""
        why = self.check(dist)
        if why is not None:
            raise ValueError(f"norm screen: {why}")
        entry = float(dist)
        if self.history:
            entry = min(entry, self.growth * lower_median(self.history))
        self.history.append(entry)

    def state_dict(self) -> dict[str, Any]:
        """The screen's settings and distance history, for the checkpoint."""
        return {"cap": self.cap, "factor": self.factor, "window": self.window,
                "min_history": self.min_history, "growth": self.growth,
                "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the distance history written by :meth:`state_dict` (the settings are the
        configuration's). A history from before the step bound (an older checkpoint, whose
        screen accepted anything at first) is brought under it: entries that are not finite
        are dropped, larger ones clipped to the cap, and one warning line says so."""
        raw = [float(x) for x in state["history"]]
        kept = [min(max(x, 0.0), self.cap) for x in raw if math.isfinite(x)]
        changed = len(kept) != len(raw) or any(k != x for k, x in zip(kept, raw))
        if changed:
            log.warning("checkpoint's norm history had %d of %d entries outside [0, step bound "
                        "%.4g]; brought under it", sum(1 for x in raw if not 0 <= x <= self.cap),
                        len(raw), self.cap)
        self.history = deque(kept, maxlen=self.window)
