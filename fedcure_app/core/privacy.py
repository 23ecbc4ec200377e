"""A differentially private label histogram: what a client may tell the cloud about its data.

Coalition formation needs each client's label histogram (samples per class); the histogram is
all the cloud learns about a client's data besides its sample count. Adding or removing one
sample changes exactly one count by 1, so the histogram's L1 sensitivity is 1 and the Laplace
mechanism with scale 1/ε makes one release ε-differentially private: for any two data sets
that differ in one sample, the probability of any output changes by at most a factor e^ε.
Smaller ε hides more (ε = 0.1: an output is nearly as likely with or without any one sample)
and costs accuracy: each count is off by |noise| > t with probability exp(−t·ε), e.g. by more
than 3 samples with probability e^(−3) ≈ 5 % at ε = 1. Clipping at 0, rounding and the
minimum-count rule are post-processing, which keeps the guarantee.
"""

from __future__ import annotations

import math

import numpy as np


def private_histogram(counts: np.ndarray, epsilon: float, min_count: int = 0,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """``counts`` (non-negative, any shape) released with ε-differential privacy: each count
    plus Laplace noise of scale 1/ε (ε = ``math.inf``: no noise), clipped at 0 and rounded to
    an integer; then every count below ``min_count`` reported as 0. Returns int64 of
    ``counts``' shape. The noise exceeds t in magnitude with probability exp(−t·ε) per count.
    ``rng``: the noise's generator (default: a fresh unseeded one)."""
    values = np.asarray(counts, dtype=np.float64)
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0 (got {epsilon}); math.inf means no noise")
    if min_count < 0:
        raise ValueError(f"min_count must be >= 0 (got {min_count})")
    if values.size and (not np.all(np.isfinite(values)) or values.min() < 0):
        raise ValueError("counts must be finite and non-negative")
    if not math.isinf(epsilon):
        gen = rng if rng is not None else np.random.default_rng()
        values = values + gen.laplace(0.0, 1.0 / epsilon, size=values.shape)
    out = np.rint(np.clip(values, 0.0, None)).astype(np.int64)
    out[out < min_count] = 0
    return out


__all__ = ["private_histogram"]
