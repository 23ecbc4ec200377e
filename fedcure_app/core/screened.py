"""Screened potential descent for the ``fedcure`` rule on large instances (N·M in the millions).

Evaluating every one of the N×M candidate moves exactly costs O(N·M²·C) per sweep. Instead:

1. **Screen**: a second-order estimate of every move's ΔF by a few matrix products
   (:meth:`Screen.all_estimates`); keep a shortlist of the most promising moves.
2. **Work the shortlist**: re-estimate it with the current tables (updated in O(M·C) per changed
   coalition), evaluate the best few *exactly and incrementally* in one batch, and take the
   improving ones in rank order (a move's batch-mates that share none of its coalitions are
   re-derived exactly in O(C) per changed coalition, the others go back to the shortlist).
   Every accepted move is exact: ΔΦ < −tol against the current partition.
3. When no shortlist yields a move, **certify**: bound every allowed move's ΔF from below
   (:meth:`Screen.lower_bounds`, rigorous); moves whose bound is ≥ −tol/2 cannot improve (half of
   the tolerance is left for rounding); all others are evaluated exactly. If none improves, the
   partition is stable; otherwise the improving moves are taken and the descent resumes.
"""

from __future__ import annotations

import logging

import numpy as np

from fedcure_app.core.constraints import Constraints
from fedcure_app.core.descent import DescentOutcome, tol_f, valid_moves
from fedcure_app.core.partition_state import MoveEval, PartitionState
from fedcure_app.core.screening import Screen

log = logging.getLogger(__name__)

#: Moves kept from each full screening.
SHORTLIST = 4096
#: Candidates evaluated exactly per batch while working the shortlist.
BATCH = 32
_MAX_CHUNK = 1024


def _mask_invalid(X: np.ndarray, state: PartitionState, cons: Constraints,
                  all_allowed: bool) -> np.ndarray:
    """Set +inf on every (n, a) that is not an allowed move now (in place)."""
    N = X.shape[0]
    X[np.arange(N), state.assign] = np.inf
    X[~state.can_leave(np.arange(N))] = np.inf
    X[:, state.size >= cons.capacity] = np.inf
    if not all_allowed:
        X[~cons.allowed] = np.inf
    return X


def _ranked(flat: np.ndarray, keys: np.ndarray, tie: np.ndarray, M: int) -> np.ndarray:
    """Sort candidate ids by key, ties by a seeded client rank then ES index."""
    return flat[np.lexsort((tie[flat // M] * M + flat % M, keys))]


def _take_in_order(state: PartitionState, ev: MoveEval, tol_pairs: float,
                   out: DescentOutcome, max_moves: int | None) -> tuple[list[int], np.ndarray]:
    """Take the improving candidates of a batch in rank order.

    After each move the batch-mates sharing one of its coalitions are set aside, the others are
    refreshed exactly. Returns (changed coalitions, batch positions set aside).
    """
    changed: list[int] = []
    touched = np.zeros(state.M, dtype=bool)
    pos = np.arange(ev.n.size)
    aside: list[np.ndarray] = []
    while pos.size:
        good = np.flatnonzero(ev.d_f < -tol_pairs)
        if good.size == 0 or (max_moves is not None and out.moves >= max_moves):
            break
        i = int(good[0])
        a, b = int(ev.a[i]), int(ev.b[i])
        state.apply(ev, i)
        out.moves += 1
        out.trajectory.append(state.phi)
        changed += [a, b]
        touched[a] = touched[b] = True
        rest = np.arange(i + 1, ev.n.size)
        hit = touched[ev.a[rest]] | touched[ev.b[rest]]
        aside.append(pos[rest[hit]])
        keep = rest[~hit]
        pos = pos[keep]
        ev = state.refresh(ev, keep, np.array([a, b]))
    return changed, (np.concatenate(aside) if aside else np.empty(0, dtype=np.int64))


def _work_shortlist(state: PartitionState, cons: Constraints, screen: Screen, n: np.ndarray,
                    a: np.ndarray, tie: np.ndarray, tol: float, out: DescentOutcome,
                    max_moves: int | None) -> int:
    """Take improving moves from a shortlist until none of it looks promising; returns moves."""
    M = state.M
    tol_pairs = tol_f(state, tol)
    thr = -0.5 * tol_pairs
    alive = np.ones(n.size, dtype=bool)
    start = out.moves
    while max_moves is None or out.moves < max_moves:
        idx = np.flatnonzero(alive)
        ok = valid_moves(state, cons, n[idx], a[idx])
        alive[idx[~ok]] = False
        idx = idx[ok]
        if idx.size == 0:
            break
        e = screen.estimates(n[idx], a[idx])
        hopeful = e < thr
        idx, e = idx[hopeful], e[hopeful]
        if idx.size == 0:
            break
        if idx.size > BATCH:
            part = np.argpartition(e, BATCH - 1)[:BATCH]
            idx, e = idx[part], e[part]
        order = np.lexsort((tie[n[idx]] * M + a[idx], e))
        top = idx[order]
        alive[top] = False
        ev = state.evaluate(n[top], a[top])
        out.evaluations += top.size
        changed, aside = _take_in_order(state, ev, tol_pairs, out, max_moves)
        alive[top[aside]] = True
        if changed:
            screen.update(changed)
    return out.moves - start


def _exact_pass(state: PartitionState, cons: Constraints, ranked: np.ndarray, tol: float,
                out: DescentOutcome, *, accept: bool, max_moves: int | None) -> int:
    """Evaluate ranked candidates exactly in adaptively sized chunks, taking (``accept``) the
    first improving move of each chunk and re-evaluating the candidates after it. Returns the
    moves taken (with ``accept=False``: 1 as soon as an improving move exists). A pass that takes
    nothing has evaluated every candidate."""
    M = state.M
    tol_pairs = tol_f(state, tol)
    n_all, a_all = ranked // M, ranked % M
    todo = np.arange(ranked.size)
    todo = todo[valid_moves(state, cons, n_all[todo], a_all[todo])]
    hits, tries, taken, ptr = 1.0, 2.0, 0, 0
    while ptr < todo.size:
        if max_moves is not None and out.moves >= max_moves:
            break
        chunk = int(min(_MAX_CHUNK, max(1.0, tries / hits)))
        sel = todo[ptr:ptr + chunk]
        ev = state.evaluate(n_all[sel], a_all[sel])
        out.evaluations += sel.size
        good = np.flatnonzero(ev.d_f < -tol_pairs)
        hits, tries = 0.9 * hits, 0.9 * tries
        if good.size == 0:
            tries += sel.size
            ptr += sel.size
            continue
        if not accept:
            return 1
        i = int(good[0])
        state.apply(ev, i)
        out.moves += 1
        out.trajectory.append(state.phi)
        taken += 1
        hits, tries = hits + 1.0, tries + i + 1
        rest = todo[ptr + i + 1:]
        todo = rest[valid_moves(state, cons, n_all[rest], a_all[rest])]
        ptr = 0
    return taken


def _bounded_candidates(state: PartitionState, cons: Constraints, screen: Screen, tol: float,
                        tie: np.ndarray, all_allowed: bool) -> np.ndarray:
    """Allowed moves whose rigorous ΔF lower bound is below −tol/2, most negative bound first."""
    screen.resync()  # row sums recomputed from the tables: no accumulated rounding in the bound
    L = _mask_invalid(screen.lower_bounds(), state, cons, all_allowed).ravel()
    flat = np.flatnonzero(L < -0.5 * tol_f(state, tol))
    return _ranked(flat, L[flat], tie, state.M)


def certify(state: PartitionState, cons: Constraints, tol: float) -> tuple[bool, int]:
    """Is the partition stable under the fedcure rule? Returns (stable, exact evaluations)."""
    if state.M < 2:
        return True, 0
    probe = DescentOutcome(trajectory=[])
    ranked = _bounded_candidates(state, cons, Screen(state), tol, np.arange(state.assign.size),
                                 bool(cons.allowed.all()))
    found = _exact_pass(state, cons, ranked, tol, probe, accept=False, max_moves=None)
    return found == 0, probe.evaluations


def screened_descent(state: PartitionState, cons: Constraints, *, tol: float,
                     max_moves: int | None, rng: np.random.Generator) -> DescentOutcome:
    """Descend Φ by exact improving moves found through screening; certify stability at the end
    (see the module docstring)."""
    out = DescentOutcome(trajectory=[state.phi])
    N, M = state.assign.size, state.M
    if M < 2:
        out.stable = True
        return out
    tie = rng.permutation(N)
    all_allowed = bool(cons.allowed.all())
    thr = -0.5 * tol_f(state, tol)
    screen = Screen(state)
    while True:
        if max_moves is not None and out.moves >= max_moves:
            out.stable, evals = certify(state, cons, tol)
            out.evaluations += evals
            return out
        screen.resync()
        E = _mask_invalid(screen.all_estimates(), state, cons, all_allowed).ravel()
        out.screenings += 1
        flat = np.flatnonzero(E < thr)
        if flat.size > SHORTLIST:
            flat = flat[np.argpartition(E[flat], SHORTLIST - 1)[:SHORTLIST]]
        moved = _work_shortlist(state, cons, screen, flat // M, flat % M, tie, tol, out,
                                max_moves)
        log.debug("screening %d: %d shortlisted, %d moves, phi=%.3e", out.screenings,
                  flat.size, moved, state.phi)
        if moved:
            continue
        ranked = _bounded_candidates(state, cons, screen, tol, tie, all_allowed)
        out.screenings += 1
        moved = _exact_pass(state, cons, ranked, tol, out, accept=True, max_moves=max_moves)
        log.debug("certification: %d candidates not ruled out by the bound, %d moves",
                  ranked.size, moved)
        if moved == 0 and (max_moves is None or out.moves < max_moves):
            out.stable = True
            return out
        screen = Screen(state)
