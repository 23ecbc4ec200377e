"""Potential descent for the coalition-friendly (``fedcure``) and ``pareto`` preference rules.

A move of client n from coalition b to a is *improving* when it lowers the potential Φ (average
pairwise JSD, Eq. 3) by more than ``tol`` (nats); the ``pareto`` rule additionally requires that
neither a's nor b's mean JSD to the other coalitions rises by more than ``tol``. Every accepted
move lowers Φ by more than ``tol``, so the descent ends, and it ends at a *stable* partition:
no single allowed move (reachable ES, capacity, never emptying a coalition) is improving.

Two ways to find moves, same rule and same stability notion:

- :func:`sweep_descent` (Algorithm 1 of the paper): clients take turns in a seeded random order;
  each evaluates every allowed ES exactly and incrementally and takes the most improving move.
  A sweep without a move has checked every allowed move exactly at the final state.
- :func:`fedcure_app.core.screened.screened_descent` (large N·M): rank all moves by a cheap
  estimate, evaluate the promising ones exactly, and certify stability with a rigorous bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcure_app.core.constraints import Constraints
from fedcure_app.core.partition_state import MoveEval, PartitionState


@dataclass
class DescentOutcome:
    """Moves made, Φ after each of them (first = initial Φ), stability, exact evaluations."""

    trajectory: list[float]
    moves: int = 0
    stable: bool = False
    evaluations: int = 0
    screenings: int = 0


def tol_f(state: PartitionState, tol: float) -> float:
    """``tol`` on Φ expressed on the pair-sum scale F."""
    return tol / state.scale if state.scale > 0 else np.inf


def _improving(ev: MoveEval, tol_pairs: float, tol: float, rule: str) -> np.ndarray:
    ok = ev.d_f < -tol_pairs
    if rule == "pareto":
        ok &= (ev.d_mu_a <= tol) & (ev.d_mu_b <= tol)
    return ok


def _client_targets(state: PartitionState, cons: Constraints, n: int) -> np.ndarray:
    """ESs client n may move to now (allowed, below capacity, not its own); empty if it cannot
    leave its coalition."""
    if not state.can_leave(np.array([n]))[0]:
        return np.empty(0, dtype=np.int64)
    ok = cons.allowed[n] & (state.size < cons.capacity)
    ok[state.assign[n]] = False
    return np.flatnonzero(ok)


def valid_moves(state: PartitionState, cons: Constraints, n: np.ndarray,
                a: np.ndarray) -> np.ndarray:
    """Which candidate moves (n[i] → a[i]) are allowed now: another ES, reachable, below
    capacity, and the client may leave its coalition."""
    ok = (a != state.assign[n]) & cons.allowed[n, a] & (state.size[a] < cons.capacity[a])
    return ok & state.can_leave(n)


def sweep_check(state: PartitionState, cons: Constraints, rule: str,
                tol: float) -> tuple[bool, int]:
    """Exactly evaluate every allowed move at the current state.

    Returns (no move is improving, number of exact evaluations)."""
    tol_pairs = tol_f(state, tol)
    evals = 0
    for n in range(state.assign.size):
        targets = _client_targets(state, cons, n)
        if targets.size == 0:
            continue
        ev = state.evaluate(np.full(targets.size, n), targets)
        evals += targets.size
        if np.any(_improving(ev, tol_pairs, tol, rule)):
            return False, evals
    return True, evals


def sweep_descent(state: PartitionState, cons: Constraints, rule: str, *, tol: float,
                  max_moves: int | None, rng: np.random.Generator) -> DescentOutcome:
    """Clients in seeded random order take their most improving allowed move (Algorithm 1)."""
    out = DescentOutcome(trajectory=[state.phi])
    tol_pairs = tol_f(state, tol)
    N = state.assign.size
    while True:
        moved = False
        for n in rng.permutation(N):
            if max_moves is not None and out.moves >= max_moves:
                out.stable, evals = sweep_check(state, cons, rule, tol)
                out.evaluations += evals
                return out
            targets = _client_targets(state, cons, int(n))
            if targets.size == 0:
                continue
            ev = state.evaluate(np.full(targets.size, n), targets)
            out.evaluations += targets.size
            ok = _improving(ev, tol_pairs, tol, rule)
            if np.any(ok):
                i = int(np.argmin(np.where(ok, ev.d_f, np.inf)))
                state.apply(ev, i)
                out.moves += 1
                out.trajectory.append(state.phi)
                moved = True
        if not moved:
            out.stable = True
            return out
