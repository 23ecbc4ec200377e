"""Input validation shared by the core modules: one clear ``ValueError`` per bad input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def finite_array(x: Any, name: str, *, ndim: int | None = None, dtype=np.float64) -> np.ndarray:
    """``x`` as a float array with every entry finite (and ``ndim`` dimensions if given)."""
    try:
        arr = np.asarray(x, dtype=dtype)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric, got {type(x).__name__}") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or Inf")
    return arr


def counts_matrix(x: Any, name: str = "label_counts") -> np.ndarray:
    """A 2-D, finite, non-negative (N, C) float matrix of counts (or probabilities)."""
    arr = finite_array(x, name, ndim=2)
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column, got {arr.shape}")
    if np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative")
    return arr


def index_vector(x: Any, name: str, length: int, upper: int) -> np.ndarray:
    """An int64 vector of ``length`` indices, each in ``[0, upper)``."""
    arr = np.asarray(x)
    if arr.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr))
                and np.all(arr == np.round(arr))):
            raise ValueError(f"{name} must hold integer indices")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        bad = int(arr[(arr < 0) | (arr >= upper)][0])
        raise ValueError(f"{name} holds index {bad}, outside [0, {upper})")
    return arr


def positive_int(x: Any, name: str, *, minimum: int = 1) -> int:
    """``x`` as an int ≥ ``minimum`` (bools and non-integral values rejected)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        if isinstance(x, (float, np.floating)) and math.isfinite(x) and float(x).is_integer():
            x = int(x)
        else:
            raise ValueError(f"{name} must be an integer, got {x!r}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def finite_float(x: Any, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """``x`` as a finite float inside the given (open or closed) bounds."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if low is not None and (v < low or (low_open and v == low)):
        op = ">" if low_open else ">="
        raise ValueError(f"{name} must be {op} {low}, got {v}")
    if high is not None and (v > high or (high_open and v == high)):
        op = "<" if high_open else "<="
        raise ValueError(f"{name} must be {op} {high}, got {v}")
    return v


def choice(x: Any, name: str, options: tuple[str, ...]) -> str:
    """``x`` (lower-cased) if it is one of ``options``, else a ValueError listing them."""
    if not isinstance(x, str) or x.lower() not in options:
        raise ValueError(f"unknown {name} {x!r}; choose one of {', '.join(options)}")
    return x.lower()
