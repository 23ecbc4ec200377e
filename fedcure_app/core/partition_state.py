"""Incremental bookkeeping of a client→ES partition for the formation game.

The potential is Φ = (2 / (M(M−1))) · Σ_{a<k} JSD(P_a, P_k) (Eq. 3), with P_a the label
distribution of coalition a. Moving client n (count vector v, mass w = Σv) from coalition b to
coalition a changes only P_a and P_b, hence only the pairs that involve a or b:

    ΔF = Σ_{k∉{a,b}} [JSD(P_a', P_k) − JSD(P_a, P_k)] + [JSD(P_b', P_k) − JSD(P_b, P_k)]
         + JSD(P_a', P_b') − JSD(P_a, P_b),            ΔΦ = ΔF · 2/(M(M−1)).

:meth:`PartitionState.evaluate` computes this exactly in O(M·C) per candidate (vectorised over a
batch of candidates) from the cached pairwise JSD matrix; Eq. 3 is never recomputed from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcure_app.core.divergence import _TINY, jsd_matrix, negentropy, xlogx


def _rowsum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis as a matrix–vector product (fast for short rows)."""
    return x @ np.ones(x.shape[-1])


@dataclass
class MoveEval:
    """Exact effect of a batch of K candidate moves (client n: b → a) on the current state.

    ``d_f``: ΔF (sum over pairs, nats); ``d_mu_a``/``d_mu_b``: change of coalition a's / b's mean
    JSD to the other M−1 coalitions. ``new`` (2K, C): the distributions P_a' (first K rows) and
    P_b' (last K rows), ``nh_new`` their negentropies; ``rows`` (2K, M+1): their JSD to every
    current coalition, last column JSD(P_a', P_b').
    """

    n: np.ndarray
    a: np.ndarray
    b: np.ndarray
    d_f: np.ndarray
    d_mu_a: np.ndarray
    d_mu_b: np.ndarray
    rows: np.ndarray
    new: np.ndarray
    nh_new: np.ndarray


class PartitionState:
    """Coalition sums S (M, C), masses s, distributions P, negentropies and the JSD matrix J.

    ``counts`` (N, C) are the clients' label counts (float), ``assignment`` (N,) their ESs.
    Every coalition must hold at least one sample.
    """

    def __init__(self, counts: np.ndarray, assignment: np.ndarray, num_edges: int) -> None:
        self.V = np.asarray(counts, dtype=np.float64)
        self.w = self.V.sum(axis=1)
        safe = np.where(self.w > 0, self.w, 1.0)
        #: each client's own label distribution (zero row for a client without samples)
        self.U = self.V / safe[:, None]
        self.M = int(num_edges)
        self.assign = np.asarray(assignment, dtype=np.int64).copy()
        self.S = np.zeros((self.M, self.V.shape[1]))
        np.add.at(self.S, self.assign, self.V)
        self.s = self.S.sum(axis=1)
        self.size = np.bincount(self.assign, minlength=self.M).astype(np.int64)
        if np.any(self.s <= 0):
            m = int(np.flatnonzero(self.s <= 0)[0])
            raise ValueError(
                f"ES {m} has no samples in the initial assignment: every coalition needs a "
                "label distribution"
            )
        self.P = self.S / self.s[:, None]
        #: P transposed (C, M), contiguous: the layout of the batched evaluation
        self.PT = np.ascontiguousarray(self.P.T)
        self.all_positive = bool(self.P.min() > 0.0)
        self.nh = negentropy(self.P)
        self.J = jsd_matrix(self.P)
        self.rowsum = _rowsum(self.J)
        self.F = float(np.triu(self.J, 1).sum())
        self.scale = 2.0 / (self.M * (self.M - 1)) if self.M > 1 else 0.0
        #: (client, from ES, to ES) of every move applied, in order
        self.history: list[tuple[int, int, int]] = []

    @property
    def phi(self) -> float:
        """Current potential Φ (average pairwise JSD, nats)."""
        return max(0.0, self.F * self.scale)

    def can_leave(self, n: np.ndarray) -> np.ndarray:
        """Whether each client may leave its coalition without emptying it (of clients or of
        samples); clients without samples never move (their move changes nothing)."""
        b = self.assign[n]
        rest = self.s[b] - self.w[n]
        return (self.size[b] > 1) & (self.w[n] > 0) & (rest > 1e-12 * self.s[b])

    def evaluate(self, n: np.ndarray, a: np.ndarray) -> MoveEval:
        """Exact ΔF of moving each client ``n[i]`` from its coalition to ``a[i]`` (batch, O(K·M·C)).

        The caller guarantees ``a[i]`` differs from the client's coalition and that
        :meth:`can_leave` holds.
        """
        n = np.asarray(n, dtype=np.int64)
        a = np.asarray(a, dtype=np.int64)
        k, M, C = n.size, self.M, self.P.shape[1]
        b = self.assign[n]
        v = self.V[n]
        w = self.w[n]
        ab = np.concatenate((a, b))
        num = self.S[ab]
        num[:k] += v
        num[k:] -= v
        np.maximum(num, 0.0, out=num)
        den = self.s[ab]
        den[:k] += w
        den[k:] -= w
        new = num / den[:, None]  # rows 0..k-1: P_a', rows k..2k-1: P_b'
        nh_new = _rowsum(xlogx(new))
        # mixtures m = (P_new + P_k)/2 for every k, plus (P_a' + P_b')/2 in the last column;
        # classes on the middle axis so the long axis (coalitions) is contiguous
        mix = np.empty((2 * k, C, M + 1))
        np.add(new[:, :, None], self.PT[None, :, :], out=mix[:, :, :M])
        np.add(new[:k], new[k:], out=mix[:k, :, M])
        mix[k:, :, M] = mix[:k, :, M]
        mix *= 0.5
        if self.all_positive and (k == 0 or new.min() > 0.0):
            logs = np.log(mix)
        else:
            logs = np.log(np.maximum(mix, _TINY))
        logs *= mix
        sum_mlogm = logs.sum(axis=1)  # (2k, M+1)
        nh_other = np.empty((2 * k, M + 1))
        nh_other[:, :M] = self.nh[None, :]
        nh_other[:k, M] = nh_new[k:]
        nh_other[k:, M] = nh_new[:k]
        nh_other += nh_new[:, None]
        nh_other *= 0.5
        rows = nh_other - sum_mlogm
        return self._finish(n, a, b, rows, new, nh_new)

    def _finish(self, n, a, b, rows, new, nh_new) -> MoveEval:
        """ΔF and Δμ from the candidates' new JSD rows (``rows`` (2K, M+1): P_a' rows, then P_b'
        rows, last column JSD(P_a', P_b')) against the cached matrix and its row sums."""
        k, M = n.size, self.M
        jab = rows[:k, M]
        body = rows[:, :M]
        r = np.arange(2 * k)
        aa = np.concatenate((a, a))
        bb = np.concatenate((b, b))
        kept = _rowsum(body) - body[r, aa] - body[r, bb]
        j_ab_old = self.J[a, b]
        sum_a = kept[:k] - (self.rowsum[a] - j_ab_old)
        sum_b = kept[k:] - (self.rowsum[b] - j_ab_old)
        d_ab = jab - j_ab_old
        denom = max(1, M - 1)
        return MoveEval(
            n=n, a=a, b=b, d_f=sum_a + sum_b + d_ab,
            d_mu_a=(sum_a + d_ab) / denom, d_mu_b=(sum_b + d_ab) / denom,
            rows=rows, new=new, nh_new=nh_new,
        )

    def refresh(self, ev: MoveEval, keep: np.ndarray, changed: np.ndarray) -> MoveEval:
        """Re-derive candidates ``keep`` of an older evaluation after moves that changed only the
        coalitions ``changed`` (none of which is a candidate's a or b, nor did its client move):
        only their JSD to the changed coalitions is recomputed, O(K·|changed|·C)."""
        k = ev.n.size
        sel = np.concatenate((keep, keep + k))
        rows = ev.rows[sel]
        new = ev.new[sel]
        nh_new = ev.nh_new[sel]
        if changed.size and keep.size:
            mix = new[:, :, None] + self.PT[None, :, changed]
            mix *= 0.5
            rows[:, changed] = (0.5 * (nh_new[:, None] + self.nh[changed][None, :])
                                - xlogx(mix).sum(axis=1))
        return self._finish(ev.n[keep], ev.a[keep], ev.b[keep], rows, new, nh_new)

    def apply(self, ev: MoveEval, i: int) -> None:
        """Carry out candidate ``i`` of an evaluation made against the current state."""
        n, a, b = int(ev.n[i]), int(ev.a[i]), int(ev.b[i])
        k, M = ev.n.size, self.M
        v = self.V[n]
        self.S[a] += v
        self.S[b] = np.maximum(self.S[b] - v, 0.0)
        self.s[a] += self.w[n]
        self.s[b] -= self.w[n]
        self.P[a] = ev.new[i]
        self.P[b] = ev.new[k + i]
        self.PT[:, a] = ev.new[i]
        self.PT[:, b] = ev.new[k + i]
        if self.all_positive:
            self.all_positive = bool(self.P[a].min() > 0.0 and self.P[b].min() > 0.0)
        self.nh[a] = ev.nh_new[i]
        self.nh[b] = ev.nh_new[k + i]
        ja, jb, jab = ev.rows[i, :M], ev.rows[k + i, :M], ev.rows[i, M]
        self.J[a, :] = ja
        self.J[:, a] = ja
        self.J[b, :] = jb
        self.J[:, b] = jb
        self.J[a, b] = self.J[b, a] = jab
        self.J[a, a] = self.J[b, b] = 0.0
        self.rowsum = _rowsum(self.J)
        self.F += float(ev.d_f[i])
        self.assign[n] = a
        self.size[a] += 1
        self.size[b] -= 1
        self.history.append((n, b, a))
