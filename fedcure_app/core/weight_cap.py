"""A per-client cap on FedAvg weights: what one client's sample count can take of its coalition.

FedAvg at the edge weights client n by p_n = |D_n| / Σ|D| (the counts each client registered).
A client that lies about |D_n| could otherwise take the whole weight. With a cap c (the
configuration's ``max-client-weight``, 0.5 by default) the weights are

    w_n = min(c, λ·|D_n|),   λ > 0 chosen so that Σ_n w_n = 1

(water-filling: the clients over the cap are held at it, the others share what is left in
proportion to their counts). It is feasible when N·c ≥ 1; otherwise no weights sum to 1 with
none above c, and every client gets 1/N, the nearest to the cap that sums to 1. The order of
the counts is kept (a larger count never gets a smaller weight), and when no client exceeds the
cap the weights are the plain proportions p_n.

:func:`capped_counts` gives the same weights as sample counts: the clients under the cap keep
their counts, those held at the cap get what the cap allows them; the coalition's data share
δ_m is then the sum of these (a liar raises its coalition's share by at most c/(1−c) of the
others' counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _counts(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(counts, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("weight cap: no counts")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or arr.sum() <= 0:
        raise ValueError("weight cap: counts must be finite, >= 0 and sum to more than 0")
    return arr


def cap_weights(counts: Sequence[float] | np.ndarray, cap: float) -> np.ndarray:
    """FedAvg weights of ``counts`` (≥ 0, positive sum), none above ``cap`` ∈ (0, 1] when
    N·cap ≥ 1 (else 1/N each); they sum to 1 and keep the counts' order (module docstring)."""
    s = _counts(counts)
    if not 0.0 < cap <= 1.0:
        raise ValueError(f"weight cap must be in (0, 1], got {cap}")
    n = s.size
    if n * cap <= 1.0:
        return np.full(n, 1.0 / n)
    w = s / s.sum()
    if w.max() <= cap:
        return w
    # water-filling: hold the largest at the cap, one at a time, until the rest fit under it
    order = np.argsort(-s, kind="stable")
    held = 0
    while True:
        held += 1
        rest = order[held:]
        left = 1.0 - held * cap
        total = s[rest].sum()
        if total <= 0:  # only zero counts remain: they share what is left equally
            out = np.full(n, cap)
            out[rest] = left / rest.size
            return out
        scaled = s[rest] * (left / total)
        if scaled.max() <= cap:
            out = np.empty(n)
            out[order[:held]] = cap
            out[rest] = scaled
            return out


def capped_counts(counts: Sequence[float] | np.ndarray, cap: float) -> np.ndarray:
    """The counts :func:`cap_weights` stands for: ``w_n · min_k(|D_k| / w_k)`` (k over
    positive weights), so clients under the cap keep their counts and the others are lowered
    to what the cap allows them (never raised)."""
    s = _counts(counts)
    w = cap_weights(s, cap)
    pos = (w > 0) & (s > 0)
    return np.minimum(s, w * float(np.min(s[pos] / w[pos])))


def capped_by_coalition(counts: Sequence[float] | np.ndarray,
                        coalitions: Sequence[Sequence[int]], cap: float) -> np.ndarray:
    """Every client's count as :func:`capped_counts` gives it within its coalition (clients
    are indices into ``counts``; a client in no coalition keeps its count; ``cap`` ≥ 1: the
    counts unchanged): what the edges weight by and what the data shares δ_m sum."""
    out = np.asarray(counts, dtype=np.float64).copy()
    if cap >= 1.0:
        return out
    for members in coalitions:
        idx = np.asarray(list(members), dtype=np.int64)
        if idx.size and out[idx].sum() > 0:
            out[idx] = capped_counts(out[idx], cap)
    return out


__all__ = ["cap_weights", "capped_by_coalition", "capped_counts"]
