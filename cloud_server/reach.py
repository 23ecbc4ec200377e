"""Can each coalition reach its target participation share δ_m?

With at most K coalitions training at once and one task in flight per coalition, coalition m
finishes at most one task per L_m seconds (its mean task latency), while the others finish
tasks at their own rates. m's long-run share of global rounds (arrivals) is therefore at most

    s_m = (1/L_m) / (1/L_m + Σ of the K−1 smallest rates 1/L_j, j ≠ m)

(m always in flight, the other K−1 slots held by the slowest coalitions; with K = M every
coalition is always in flight and s_m = (1/L_m) / Σ_j 1/L_j exactly). Lyapunov scheduling keeps
the virtual queue Q_m mean-rate stable only when δ_m ≤ s_m: Q_m grows by δ_m each round and
falls by 1 only when m is scheduled, so with δ_m > s_m it climbs without bound (by about
δ_m − s_m per round) however the scheduler chooses, and the participation constraint of
problem (P) cannot be met for m. Pure numpy; :func:`reach_warnings` words and logs the
findings.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("fedcure.cloud")


def max_shares(latency_s: np.ndarray, k: int) -> np.ndarray:
    """Upper bound s_m on each coalition's share of arrivals (see the module docstring)."""
    lat = np.asarray(latency_s, dtype=np.float64)
    if lat.ndim != 1 or lat.size == 0 or not np.all(np.isfinite(lat)) or np.any(lat <= 0):
        raise ValueError("latency_s must be positive finite seconds, one per coalition")
    m = lat.size
    if not 1 <= k <= m:
        raise ValueError(f"K={k} must be in [1, {m}]")
    rate = 1.0 / lat
    out = np.empty(m)
    for i in range(m):
        others = np.sort(np.delete(rate, i))[: k - 1]
        out[i] = rate[i] / (rate[i] + others.sum())
    return out


def unreachable(delta: np.ndarray, latency_s: np.ndarray, k: int, margin: float = 1e-9
                ) -> list[tuple[int, float, float]]:
    """``(m, δ_m, s_m)`` for every coalition whose target share exceeds its reachable share."""
    cap = max_shares(latency_s, k)
    d = np.asarray(delta, dtype=np.float64)
    return [(i, float(d[i]), float(cap[i])) for i in range(d.size) if d[i] > cap[i] + margin]



def reach_warnings(delta: np.ndarray, latency_s: np.ndarray, k: int, source: str
                   ) -> list[dict[str, Any]]:
    """One warning (logged, and as result.json's ``warnings`` entry) per coalition whose target
    share δ_m exceeds what ``k`` concurrent slots and its latency (from ``source``) allow; none
    when the latencies say nothing (e.g. a non-finite estimate)."""
    try:
        bad = unreachable(delta, latency_s, k)
    except ValueError as err:
        log.debug("reachability check skipped: %s", err)
        return []
    out = []
    for m, share, cap in bad:
        text = (f"coalition {m}: target share delta {share:.3f} is out of reach: with at "
                f"most {k} coalitions in flight and its latency (from "
                f"{source}) it can get at most {cap:.3g} of the rounds; its virtual queue "
                "will grow without bound (not mean-rate stable)")
        log.warning("%s", text)
        out.append({"kind": "unreachable-share", "coalition": m, "delta": share,
                    "max_share": cap, "source": source, "detail": text})
    return out


__all__ = ["max_shares", "reach_warnings", "unreachable"]
