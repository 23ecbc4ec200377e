"""Rigorous lower bounds on ΔF for every candidate move at once (screening for large N·M).

Moving client n (distribution u, mass w) from b to a moves the coalition distributions along a
straight line in probability space:

    P_a(t) = P_a + t·λ_a·(u − P_a),  λ_a = w/(s_a + w);
    P_b(t) = P_b + t·λ_b·(P_b − u),  λ_b = w/(s_b − w),       t ∈ [0, 1].

F = Σ_{pairs} JSD is a sum of per-class terms φ(p, q) = ½[p ln p + q ln q − (p+q) ln((p+q)/2)]
that are jointly convex, so along the path (Taylor with integral remainder)

    ΔF ≥ F'(0) + ½·min_t F''(t).

F'(0) = g_a·d_a + g_b·d_b with g_a,c = Σ_{k≠a} ½ ln(2P_a,c/(P_a,c + P_k,c)) (the gradient, an
(M, C) matrix computed in O(M²C)), so the first-order part of all N×M candidates is one matrix
product. For F'' we keep the pairs (a, k) and (b, k), k ∉ {a, b} (the pair (a, b) contributes
≥ 0 by joint convexity and is dropped): ∂²φ/∂p² = h(p, q) = ½q/(p(p+q)) decreases in p and
h(rp, q) ≥ h(p, q)/r², r ≥ 1. Along the path P_a,c grows by at most λ_a·u_c, so
1/r² ≥ 1 − 2λ_a·u_c/P_a,c; P_b,c grows by at most λ_b·P_b,c, so 1/r² ≥ 1/(1+λ_b)². This gives

    ΔF ≥ λ_a g_a·(u − P_a) + λ_b g_b·(P_b − u)
         + ½λ_a² Σ_c Ď_ac (u_c − P_ac)² − λ_a³ Σ_c (Ď_ac/P_ac) u_c (u_c − P_ac)²
         + ½ (λ_b/(1+λ_b))² Σ_c Ď_bc (P_bc − u_c)²,

with Ď_a = Σ_{k∉{a,b}} h(P_a, P_k). Expanding the squares turns every term into products of
U, U², U³ (N×C) with (M×C) coefficient matrices, evaluated per origin coalition b (because Ď
excludes b). When the client holds a class that coalition a lacks, the gradient is −∞ and the
bound is −∞ (the move must be checked exactly).

The same tables give a second-order Taylor *estimate* F'(0) + ½F''(0) (all pairs, curvature at
the start point), used only to rank candidates. :class:`Screen` keeps the (M, M, C) pair tables
and refreshes only the rows and columns of coalitions that changed, so estimates of a shortlist
stay current between full screenings.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fedcure_app.core.partition_state import PartitionState


def _pair_rows(P: np.ndarray, rows: np.ndarray,
               cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """½·ln(2P_ac/(P_ac+P_kc)) and h(P_ac, P_kc) = ½P_kc/(P_ac(P_ac+P_kc)) for a in rows, k in
    cols; zero where P_ac = 0 (handled by the missing-class rule) and on the diagonal."""
    pa = P[rows][:, None, :]
    pk = P[cols][None, :, :]
    pos = pa > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        tot = pa + pk
        lg = np.where(pos, 0.5 * np.log(np.where(pos, 2.0 * pa / tot, 1.0)), 0.0)
        h = np.where(pos, 0.5 * pk / (pa * tot), 0.0)
    same = rows[:, None] == cols[None, :]
    lg[same] = 0.0
    h[same] = 0.0
    return lg, h


class Screen:
    """Gradient and curvature tables of F for a :class:`PartitionState`, kept up to date.

    ``LG[a, k, c]`` = ½ ln(2P_ac/(P_ac+P_kc)) (so G = Σ_k LG is ∂F/∂P_a), ``H[a, k, c]`` =
    h(P_ac, P_kc) (so D = Σ_k H is the diagonal of ∂²F/∂P_a²).
    """

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        idx = np.arange(state.M)
        self.LG, self.H = _pair_rows(state.P, idx, idx)
        self._sums()

    def _sums(self) -> None:
        self.G = self.LG.sum(axis=1)
        self.D = self.H.sum(axis=1)
        self.pg = (self.state.P * self.G).sum(axis=1)
        self.pos = self.state.P > 0

    def update(self, changed: Iterable[int]) -> None:
        """Refresh the tables after the distributions of coalitions ``changed`` moved:
        O(|changed|·M·C) (the row sums are updated by differences)."""
        ch = np.unique(np.fromiter(changed, dtype=np.int64))
        if ch.size == 0:
            return
        P = self.state.P
        idx = np.arange(self.state.M)
        old_lg, old_h = self.LG[:, ch], self.H[:, ch]
        lg, h = _pair_rows(P, idx, ch)
        self.LG[:, ch], self.H[:, ch] = lg, h
        self.G += (lg - old_lg).sum(axis=1)
        self.D += (h - old_h).sum(axis=1)
        self.LG[ch], self.H[ch] = _pair_rows(P, ch, idx)
        self.G[ch] = self.LG[ch].sum(axis=1)
        self.D[ch] = self.H[ch].sum(axis=1)
        self.pg = (P * self.G).sum(axis=1)
        self.pos[ch] = P[ch] > 0

    def resync(self) -> None:
        """Recompute the row sums from the tables (drops accumulated rounding)."""
        self._sums()

    # ------------------------------------------------------------------ estimates
    def _leave_terms(self, n: np.ndarray) -> np.ndarray:
        """b-side part of the estimate, λ_b·(g_b·(P_b − u) + ½λ_b·Σ_c D_bc (P_bc − u_c)²), for
        clients n leaving their coalitions b."""
        st = self.state
        b = st.assign[n]
        u, w = st.U[n], st.w[n]
        rest = st.s[b] - w
        lam_b = np.where(rest > 0, w / np.where(rest > 0, rest, 1.0), 0.0)
        d = st.P[b] - u
        lin = np.einsum("ij,ij->i", d, self.G[b])
        quad = np.einsum("ij,ij,ij->i", d, d, self.D[b])
        return lam_b * (lin + 0.5 * lam_b * quad)

    def estimates(self, n: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Second-order estimate of ΔF for the candidates (n[i] → a[i]) (no validity checks)."""
        st = self.state
        u, w = st.U[n], st.w[n]
        lam_a = w / (st.s[a] + w)
        d = u - st.P[a]
        lin = np.einsum("ij,ij->i", d, self.G[a])
        quad = np.einsum("ij,ij,ij->i", d, d, self.D[a])
        e = lam_a * (lin + 0.5 * lam_a * quad) + self._leave_terms(n)
        missing = ((u > 0) & ~self.pos[a]).any(axis=1)
        e[missing] = -np.inf
        return e

    def all_estimates(self) -> np.ndarray:
        """Second-order estimate of ΔF for every (n, a), shape (N, M), by matrix products."""
        st = self.state
        U, w, s, P = st.U, st.w, st.s, st.P
        N = U.shape[0]
        ones = np.ones((N, 1))
        X = np.hstack((U, ones)) @ np.hstack((self.G, -self.pg[:, None])).T
        DP = self.D * P
        coef = np.hstack((0.5 * self.D, -DP, 0.5 * (DP * P).sum(axis=1)[:, None]))
        E = np.hstack((U * U, U, ones)) @ coef.T  # ½·Σ_c D_ac (u_c − P_ac)²
        lam = s[None, :] + w[:, None]
        np.divide(w[:, None], lam, out=lam)
        E *= lam
        E += X
        E *= lam
        E += self._leave_terms(np.arange(N))[:, None]
        if not self.pos.all():
            E[((U > 0).astype(np.float64) @ (~self.pos).astype(np.float64).T) > 0] = -np.inf
        return E

    # ------------------------------------------------------------------ rigorous bound
    def lower_bounds(self) -> np.ndarray:
        """Rigorous lower bound on the exact ΔF of every (n, a), shape (N, M) (module docstring);
        −inf where the client holds a class that coalition a lacks."""
        st = self.state
        P, U, w, s = st.P, st.U, st.w, st.s
        N, M = U.shape[0], st.M
        G, H, D, pg, pos = self.G, self.H, self.D, self.pg, self.pos
        UG = U @ G.T
        L = np.full((N, M), np.inf)
        order = np.argsort(st.assign, kind="stable")
        bounds = np.searchsorted(st.assign[order], np.arange(M + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            Pinv = np.where(pos, 1.0 / np.where(pos, P, 1.0), 0.0)
            for b in range(M):
                idx = order[bounds[b]:bounds[b + 1]]
                if idx.size == 0:
                    continue
                wb = w[idx]
                lam_a = wb[:, None] / (s[None, :] + wb[:, None])
                rest = s[b] - wb
                lam_b = np.where(rest > 0, wb / np.where(rest > 0, rest, 1.0), 0.0)
                lin = lam_a * (UG[idx] - pg[None, :]) + (lam_b * (pg[b] - UG[idx, b]))[:, None]
                K = D - H[:, b, :]  # Ď_a: pairs (a, k), k ∉ {a, b}
                Kp = K * P
                Ub = U[idx]
                U2 = Ub * Ub
                T2 = U2 @ K.T
                T1 = Ub @ Kp.T
                A = T2 - 2.0 * T1 + (Kp * P).sum(axis=1)[None, :]
                B = (U2 * Ub) @ (K * Pinv).T - 2.0 * T2 + T1
                curv_a = lam_a * lam_a * (0.5 * A - lam_a * B)
                dB2 = (P[b][None, :] - Ub) ** 2
                q = lam_b / (1.0 + lam_b)
                # Ď_b: pairs (b, k), k ∉ {a, b}; H[b].T[c, a] = h(P_bc, P_ac)
                curv_b = 0.5 * (q * q)[:, None] * ((dB2 @ D[b])[:, None] - dB2 @ H[b].T)
                L[idx] = lin + curv_a + curv_b
        if not pos.all():
            L[((U > 0).astype(np.float64) @ (~pos).astype(np.float64).T) > 0] = -np.inf
        return L
