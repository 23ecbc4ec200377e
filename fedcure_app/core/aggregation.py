"""Model aggregation: FedAvg at the edge, staleness-weighted mixing at the cloud.

- Edge (synchronous FedAvg): ω_m = Σ_n |D_n|·ω_n / Σ_n |D_n| per tensor.
- Cloud (asynchronous): ω ← (1 − ξ)·ω + ξ·ω_m with ξ = ℓ·k^φ, φ the staleness (global versions
  since the model the coalition trained from).

Arithmetic is float64; results keep each input tensor's dtype (integer tensors are rounded).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedcure_app.core._checks import finite_array, finite_float, positive_int


def _cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        return np.rint(x).astype(dtype)
    return x.astype(dtype, copy=False)


def _check_tensor(x, where: str) -> np.ndarray:
    arr = np.asarray(x)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{where} is not numeric (dtype {arr.dtype})")
    if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
        raise ValueError(f"{where} contains NaN or Inf")
    return arr


def fedavg(models: Sequence[Sequence[np.ndarray]], weights) -> list[np.ndarray]:
    """Weighted mean of K models (each a list of tensors), weights = sample counts (≥ 0, sum > 0).

    Every model must have the same number of tensors with matching shapes.
    """
    if len(models) == 0:
        raise ValueError("fedavg needs at least one model")
    w = finite_array(weights, "weights", ndim=1)
    if w.size != len(models):
        raise ValueError(f"got {len(models)} models but {w.size} weights")
    if np.any(w < 0):
        raise ValueError("weights must be non-negative sample counts")
    total = w.sum()
    if total <= 0:
        raise ValueError("weights sum to zero: nothing to average")
    first = [_check_tensor(t, f"model 0 tensor {i}") for i, t in enumerate(models[0])]
    acc = [np.zeros(t.shape, dtype=np.float64) for t in first]
    for k, model in enumerate(models):
        if len(model) != len(first):
            raise ValueError(f"model {k} has {len(model)} tensors, model 0 has {len(first)}")
        for i, tensor in enumerate(model):
            t = _check_tensor(tensor, f"model {k} tensor {i}")
            if t.shape != first[i].shape:
                raise ValueError(
                    f"model {k} tensor {i} has shape {t.shape}, model 0 has {first[i].shape}"
                )
            if w[k]:
                acc[i] += (w[k] / total) * t.astype(np.float64, copy=False)
    return [_cast(a, t.dtype) for a, t in zip(acc, first)]


def staleness_weight(staleness: int, ell: float, k: float) -> float:
    """ξ = ℓ·k^φ for staleness φ ≥ 0 (integer global versions), 0 < ℓ ≤ 1, 0 < k ≤ 1."""
    phi = positive_int(staleness, "staleness", minimum=0)
    ell = finite_float(ell, "ell", low=0.0, high=1.0, low_open=True)
    k = finite_float(k, "k", low=0.0, high=1.0, low_open=True)
    return float(ell * k ** phi)


def cloud_update(global_arrays: Sequence[np.ndarray], edge_arrays: Sequence[np.ndarray],
                 xi: float) -> list[np.ndarray]:
    """ω ← (1 − ξ)·ω + ξ·ω_m per tensor, 0 ≤ ξ ≤ 1; keeps the global tensors' dtypes."""
    xi = finite_float(xi, "xi", low=0.0, high=1.0)
    if len(global_arrays) != len(edge_arrays):
        raise ValueError(
            f"edge model has {len(edge_arrays)} tensors, global model has {len(global_arrays)}"
        )
    out = []
    for i, (g, e) in enumerate(zip(global_arrays, edge_arrays)):
        g = _check_tensor(g, f"global tensor {i}")
        e = _check_tensor(e, f"edge tensor {i}")
        if g.shape != e.shape:
            raise ValueError(f"tensor {i}: edge shape {e.shape} != global shape {g.shape}")
        if np.issubdtype(g.dtype, np.floating):
            # mix in the tensor's own precision: no float64 round trip for large models
            mixed = np.multiply(g, 1.0 - xi, dtype=g.dtype)
            mixed += np.multiply(e, xi, dtype=g.dtype)
            out.append(mixed)
        else:
            mixed = (1.0 - xi) * g.astype(np.float64) + xi * e.astype(np.float64)
            out.append(_cast(mixed, g.dtype))
    return out
