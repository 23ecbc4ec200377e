"""Jensen–Shannon divergence between label distributions (natural log, so 0 ≤ JSD ≤ ln 2).

JSD(P, Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M) with M = (P + Q)/2, equivalently
H(M) − (H(P) + H(Q))/2 with H the Shannon entropy in nats. Disjoint supports give ln 2.

The average pairwise JSD of a partition (the paper's Eq. 3) is the mean of JSD over all
M(M−1)/2 unordered pairs of coalition label distributions; it is the potential that the
coalition formation game lowers.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import xlogy

from fedcure_app.core._checks import counts_matrix, finite_array, index_vector, positive_int

LN2 = math.log(2.0)

#: Elements per temporary block when building an M×M×C table (bounds memory for large M).
_BLOCK_ELEMENTS = 4_000_000


def _distribution(x, name: str) -> np.ndarray:
    arr = finite_array(x, name, ndim=1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative")
    total = arr.sum()
    if total <= 0:
        raise ValueError(f"{name} is all zeros: no distribution to compare")
    return arr / total


def normalise_rows(counts, name: str = "counts") -> np.ndarray:
    """Row-normalise a non-negative (M, C) count matrix into distributions; all-zero rows raise."""
    arr = counts_matrix(counts, name)
    totals = arr.sum(axis=1)
    if np.any(totals <= 0):
        row = int(np.flatnonzero(totals <= 0)[0])
        raise ValueError(f"{name} row {row} is all zeros: it has no label distribution")
    return arr / totals[:, None]


def js_divergence(p, q) -> float:
    """JSD(P, Q) in nats of two 1-D count or probability vectors (normalised here).

    Symmetric, 0 iff the normalised vectors are equal, ln 2 for disjoint supports.
    Computed in the KL form ½Σ p·ln(p/m) + ½Σ q·ln(q/m), accurate for nearly equal inputs,
    and clipped to [0, ln 2] against rounding.
    """
    pp = _distribution(p, "p")
    qq = _distribution(q, "q")
    if pp.shape != qq.shape:
        raise ValueError(f"p and q must have the same length, got {pp.size} and {qq.size}")
    m = 0.5 * (pp + qq)
    safe_m = np.where(m > 0, m, 1.0)
    value = 0.5 * (xlogy(pp, pp / safe_m).sum() + xlogy(qq, qq / safe_m).sum())
    return float(min(max(value, 0.0), LN2))


_TINY = np.finfo(np.float64).tiny


def xlogx(x: np.ndarray) -> np.ndarray:
    """Elementwise x·ln x for x ≥ 0 with 0·ln 0 = 0 (a new array)."""
    out = np.maximum(x, _TINY)
    np.log(out, out=out)
    out *= x
    return out


def _last_axis_sum(x: np.ndarray) -> np.ndarray:
    return x @ np.ones(x.shape[-1])


def negentropy(p: np.ndarray) -> np.ndarray:
    """Σ_c p_c ln p_c over the last axis (−H(P), nats; 0·ln 0 = 0)."""
    return _last_axis_sum(xlogx(np.asarray(p, dtype=np.float64)))


def jsd_broadcast(p: np.ndarray, q: np.ndarray, nh_p=None, nh_q=None) -> np.ndarray:
    """JSD over the last axis of two broadcastable arrays of distributions (no checks, no clip).

    Entropy form ½(Σ p ln p + Σ q ln q) − Σ m ln m with m = (p + q)/2; ``nh_p``/``nh_q`` are
    precomputed :func:`negentropy` values (broadcastable to the result). The incremental
    formation code and :func:`jsd_matrix` both use it, so cached and fresh values agree.
    """
    if nh_p is None:
        nh_p = negentropy(p)
    if nh_q is None:
        nh_q = negentropy(q)
    m = p + q
    m *= 0.5
    return 0.5 * (nh_p + nh_q) - _last_axis_sum(xlogx(m))


def jsd_matrix(distributions: np.ndarray) -> np.ndarray:
    """Symmetric (M, M) matrix of pairwise JSD (nats) between the rows of an (M, C) array of
    distributions; zero diagonal. Rows must already be normalised."""
    P = np.asarray(distributions, dtype=np.float64)
    M, C = P.shape
    nh = negentropy(P)
    J = np.empty((M, M))
    step = max(1, _BLOCK_ELEMENTS // max(1, M * C))
    for lo in range(0, M, step):
        hi = min(M, lo + step)
        J[lo:hi] = jsd_broadcast(P[lo:hi, None, :], P[None, :, :], nh[lo:hi, None], nh[None, :])
    J = 0.5 * (J + J.T)
    np.fill_diagonal(J, 0.0)
    return J


def pair_mean(J: np.ndarray) -> float:
    """Mean of the strict upper triangle of a symmetric (M, M) matrix (0.0 when M = 1)."""
    M = J.shape[0]
    if M < 2:
        return 0.0
    return float(np.triu(J, 1).sum() * 2.0 / (M * (M - 1)))


def average_pairwise_jsd(coalition_label_counts) -> float:
    """Eq. 3: the mean JSD over all unordered pairs of the M rows (M×C counts); 0.0 if M = 1.

    Every row needs at least one sample (an empty coalition has no distribution).
    """
    P = normalise_rows(coalition_label_counts, "coalition_label_counts")
    return max(0.0, pair_mean(jsd_matrix(P)))


def coalition_label_counts(label_counts, assignment, num_edges: int) -> np.ndarray:
    """Sum the clients' (N, C) label counts per ES: returns (M, C) with M = ``num_edges``.

    ``assignment`` (N,) gives each client's ES index in ``[0, num_edges)``.
    """
    counts = counts_matrix(label_counts)
    m = positive_int(num_edges, "num_edges")
    assign = index_vector(assignment, "assignment", counts.shape[0], m)
    c = counts.shape[1]
    flat = (assign[:, None] * c + np.arange(c)).ravel()
    return np.bincount(flat, weights=counts.ravel(), minlength=m * c).reshape(m, c)
