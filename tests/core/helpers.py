"""Shared helpers for the core tests: brute-force (from-scratch) references."""

from __future__ import annotations

import numpy as np

from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts, js_divergence


def phi(counts: np.ndarray, assignment: np.ndarray, m: int) -> float:
    """Eq. 3 from scratch."""
    return average_pairwise_jsd(coalition_label_counts(counts, assignment, m))


def mean_jsd_to_others(counts: np.ndarray, assignment: np.ndarray, m: int) -> np.ndarray:
    """Each coalition's mean JSD to the other coalitions, from scratch."""
    S = coalition_label_counts(counts, assignment, m)
    out = np.zeros(m)
    for a in range(m):
        out[a] = np.mean([js_divergence(S[a], S[k]) for k in range(m) if k != a])
    return out


def allowed_moves(counts, assignment, m, allowed=None, capacity=None):
    """Every single move (n, a) allowed by reachability, capacity and never-empty rules."""
    n_clients = len(assignment)
    sizes = np.bincount(assignment, minlength=m)
    S = coalition_label_counts(counts, assignment, m)
    cap = np.full(m, n_clients) if capacity is None else np.broadcast_to(capacity, (m,))
    for n in range(n_clients):
        b = assignment[n]
        w = counts[n].sum()
        if sizes[b] <= 1 or w <= 0 or S[b].sum() - w <= 0:
            continue
        for a in range(m):
            if a == b or sizes[a] >= cap[a]:
                continue
            if allowed is not None and not allowed[n, a]:
                continue
            yield n, a


def brute_force_improving(counts, assignment, m, rule="fedcure", tol=1e-12, allowed=None,
                          capacity=None):
    """All allowed moves the rule would accept, each checked from scratch."""
    base = phi(counts, assignment, m)
    mu = mean_jsd_to_others(counts, assignment, m) if rule == "pareto" else None
    found = []
    for n, a in allowed_moves(counts, assignment, m, allowed, capacity):
        moved = assignment.copy()
        b = moved[n]
        moved[n] = a
        d = phi(counts, moved, m) - base
        ok = d < -tol
        if ok and rule == "pareto":
            mu2 = mean_jsd_to_others(counts, moved, m)
            ok = mu2[a] <= mu[a] + tol and mu2[b] <= mu[b] + tol
        if ok:
            found.append((n, a, d))
    return found


def random_instance(seed: int, n_max: int = 40, m_max: int = 5, c_max: int = 6,
                    alpha: float = 0.3):
    """Small random federation: counts (N, C) ints and a round-robin initial assignment."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, n_max + 1))
    m = int(rng.integers(2, min(m_max, n) + 1))
    c = int(rng.integers(2, c_max + 1))
    counts = np.stack([rng.multinomial(int(rng.integers(1, 60)),
                                       rng.dirichlet(np.full(c, alpha))) for _ in range(n)])
    return counts, np.arange(n) % m, m
