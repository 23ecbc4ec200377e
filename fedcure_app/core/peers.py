"""The peers' aggregation and selection rules as pure functions (numpy only).

What a user would run instead of FedCure (docs/DESIGN.md, "The peers"):

- flat synchronous FedAvg (McMahan et al., AISTATS 2017, Alg. 1): each round the server samples
  m = max(⌊C·K⌋, 1) of the K clients (:func:`sample_clients`) and sets the global model to the
  sample-weighted mean of their models, w ← Σ_k (n_k/n)·w_k (:func:`weighted_mean`);
- HierFAVG (Liu et al., ICC 2020, Alg. 1): the same mean at every edge and again at the cloud,
  edge models weighted by their samples;
- FedBuff (Nguyen et al., AISTATS 2022, Alg. 1): after K arrivals,
  w ← w + η_g·(1/K)·Σ_i s(τ_i)·Δ_i with s(τ) = 1/√(1+τ) (:func:`buffered_step`,
  :func:`staleness_weight`);
- FedAT (Chai et al., SC 2021, Alg. 1 and Eq. 4): clients cut into tiers by latency
  (:func:`latency_tiers`); the global model is Σ_i (T_{M+1−i}/T)·w_i over the tiers' models,
  tier i (1 = fastest) weighted by the update count of its mirror tier, so tiers that update
  less often weigh more (:func:`cross_tier_weights`).

Models are lists of numpy arrays (one per layer); nothing here touches torch or the clock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Arrays = list[np.ndarray]


def sample_weights(num_samples: Sequence[float] | np.ndarray) -> np.ndarray:
    """n_k / Σ n: each model's weight in a sample-weighted mean (McMahan et al., Alg. 1)."""
    n = np.asarray(num_samples, dtype=np.float64)
    if n.ndim != 1 or n.size == 0:
        raise ValueError("give one sample count per model")
    if np.any(n < 0) or not np.all(np.isfinite(n)) or n.sum() <= 0:
        raise ValueError(f"sample counts must be finite, >= 0 and not all 0, got {n.tolist()}")
    return n / n.sum()


def weighted_mean(models: Sequence[Arrays], weights: Sequence[float] | np.ndarray) -> Arrays:
    """Σ_k weights_k·models_k layer by layer (float64 sums, each layer cast back to its dtype);
    ``weights`` should sum to 1 (:func:`sample_weights`)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(models) != w.size or w.size == 0:
        raise ValueError(f"{len(models)} models for {w.size} weights")
    out = []
    for layer in zip(*models):
        acc = np.zeros(np.shape(layer[0]), dtype=np.float64)
        for wk, a in zip(w, layer):
            acc += wk * np.asarray(a, dtype=np.float64)
        out.append(acc.astype(np.asarray(layer[0]).dtype, copy=False))
    return out


def clients_per_round(num_clients: int, fraction: float) -> int:
    """m = max(⌊C·K⌋, 1) clients of K in a FedAvg round (McMahan et al., Alg. 1)."""
    if num_clients < 1:
        raise ValueError(f"need at least one client, got {num_clients}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction C must be in (0, 1], got {fraction}")
    return max(1, int(np.floor(fraction * num_clients + 1e-9)))


def sample_clients(rng: np.random.Generator, num_clients: int, fraction: float) -> np.ndarray:
    """A uniform random set of :func:`clients_per_round` distinct clients, sorted."""
    m = clients_per_round(num_clients, fraction)
    return np.sort(rng.choice(num_clients, size=m, replace=False))


def staleness_weight(staleness: float | np.ndarray) -> float | np.ndarray:
    """s(τ) = 1/√(1+τ), FedBuff's down-weighting of an update τ versions old (τ >= 0)."""
    t = np.asarray(staleness, dtype=np.float64)
    if np.any(t < 0):
        raise ValueError(f"staleness must be >= 0, got {staleness!r}")
    out = 1.0 / np.sqrt(1.0 + t)
    return float(out) if np.ndim(out) == 0 else out


def model_delta(trained: Arrays, received: Arrays) -> Arrays:
    """Δ = w_trained − w_received, a client's update."""
    return [np.asarray(t, dtype=np.float64) - np.asarray(r, dtype=np.float64)
            for t, r in zip(trained, received)]


def buffered_step(global_arrays: Arrays, deltas: Sequence[Arrays],
                  staleness: Sequence[float] | np.ndarray, server_lr: float, *,
                  weigh_staleness: bool = True) -> Arrays:
    """FedBuff's server step: w + η_g·(1/K)·Σ_i s(τ_i)·Δ_i over the K buffered updates
    (``weigh_staleness`` False: s ≡ 1)."""
    if not deltas:
        raise ValueError("an empty buffer")
    if server_lr <= 0:
        raise ValueError(f"server_lr must be > 0, got {server_lr}")
    k = len(deltas)
    s = (np.atleast_1d(staleness_weight(np.asarray(staleness, dtype=np.float64)))
         if weigh_staleness else np.ones(k))
    if s.size != k:
        raise ValueError(f"{k} updates for {s.size} staleness values")
    step = weighted_mean(deltas, s / k)
    return [(np.asarray(g, dtype=np.float64) + server_lr * np.asarray(d, dtype=np.float64))
            .astype(np.asarray(g).dtype, copy=False) for g, d in zip(global_arrays, step)]


def latency_tiers(latency_s: Sequence[float] | np.ndarray, tiers: int) -> np.ndarray:
    """Each client's tier (0 = fastest) when clients sorted by latency are cut into ``tiers``
    groups of near-equal size (FedAT's tiering by measured response latency; ties keep client
    order)."""
    lat = np.asarray(latency_s, dtype=np.float64)
    if lat.ndim != 1 or lat.size == 0:
        raise ValueError("give one latency per client")
    if not 1 <= tiers <= lat.size:
        raise ValueError(f"tiers must be between 1 and the {lat.size} clients, got {tiers}")
    order = np.argsort(lat, kind="stable")
    out = np.empty(lat.size, dtype=np.int64)
    for t, chunk in enumerate(np.array_split(order, tiers)):
        out[chunk] = t
    return out


def cross_tier_weights(update_counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """FedAT's weights of the tier models: tier i of M (ordered fastest first) weighs
    T_{M+1−i}/T, T_j its update count so far and T = Σ_j T_j, so the slowest tier takes the
    fastest tier's count (Chai et al., Eq. 4). Uniform before any update."""
    t = np.asarray(update_counts, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or np.any(t < 0):
        raise ValueError(f"update counts must be >= 0, one per tier, got {update_counts!r}")
    if t.sum() == 0:
        return np.full(t.size, 1.0 / t.size)
    return t[::-1] / t.sum()


__all__ = ["Arrays", "buffered_step", "clients_per_round", "cross_tier_weights",
           "latency_tiers", "model_delta", "sample_clients", "sample_weights",
           "staleness_weight", "weighted_mean"]
