"""Summary statistics for the experiments: mean ± std over seeds, Cohen's d, latency COV."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single value)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_std needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError("mean_std needs finite values")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def cohens_d(a: Sequence[float], b: Sequence[float]) -> float:
    """Cohen's d of ``a`` over ``b``: (mean a − mean b) / pooled sample std.

    The pooled std is sqrt(((n_a−1)s_a² + (n_b−1)s_b²)/(n_a+n_b−2)). Needs n_a + n_b ≥ 3. When
    the pooled std is 0, returns 0 for equal means and ±inf otherwise.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.size < 1 or y.size < 1 or x.size + y.size < 3:
        raise ValueError("Cohen's d needs at least one value per group and three in all")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("Cohen's d needs finite values")
    diff = float(x.mean() - y.mean())
    ss = float(((x - x.mean()) ** 2).sum() + ((y - y.mean()) ** 2).sum())
    pooled = math.sqrt(ss / (x.size + y.size - 2))
    if pooled == 0.0 or pooled < 1e-12 * max(1.0, abs(float(x.mean())), abs(float(y.mean()))):
        return 0.0 if abs(diff) < 1e-12 else math.copysign(math.inf, diff)
    return diff / pooled


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population std / mean of positive values (0 for fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return 0.0
    mean = float(x.mean())
    if mean <= 0:
        raise ValueError("coefficient of variation needs a positive mean")
    return float(x.std() / mean)


def fmt_mean_std(mean: float, std: float, scale: float = 100.0, digits: int = 2) -> str:
    """``"83.12 ± 1.05"`` (values scaled by ``scale``, e.g. fractions to %)."""
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def fmt_d(d: float) -> str:
    """Cohen's d for a table: two decimals, ``+inf``/``-inf`` spelled out."""
    if math.isinf(d):
        return "+inf" if d > 0 else "-inf"
    return f"{d:+.2f}"


__all__ = ["cohens_d", "coefficient_of_variation", "fmt_d", "fmt_mean_std", "mean_std"]
