"""The self-centred (``selfish``) preference rule, as in reputation-aware hedonic games ("RH").

Client n prefers the ES whose coalition label distribution *without n* is closest in JSD to n's
own distribution, and moves there when that is closer than its current coalition (without n) by
more than ``tol``. Clients join look-alikes, so the partition's average JSD need not fall and the
dynamics may cycle; they stop after ``max_moves`` moves or after a sweep in which nobody wants to
(and may) move, which is what ``stable`` reports.
"""

from __future__ import annotations

import numpy as np

from fedcure_app.core.constraints import Constraints
from fedcure_app.core.descent import DescentOutcome
from fedcure_app.core.divergence import jsd_broadcast
from fedcure_app.core.partition_state import PartitionState


def _best_response(state: PartitionState, cons: Constraints, n: int, tol: float) -> int | None:
    """The ES client n would rather join (None: stay or cannot move)."""
    if not state.can_leave(np.array([n]))[0]:
        return None
    b = int(state.assign[n])
    others = state.S.copy()
    others[b] = np.maximum(others[b] - state.V[n], 0.0)
    mass = others.sum(axis=1)
    ok = cons.allowed[n] & (state.size < cons.capacity) & (mass > 0)
    ok[b] = False
    if not ok.any():
        return None
    q = others / np.where(mass > 0, mass, 1.0)[:, None]
    pref = jsd_broadcast(state.U[n][None, :], q)
    a = int(np.argmin(np.where(ok, pref, np.inf)))
    return a if pref[a] < pref[b] - tol else None


def selfish_check(state: PartitionState, cons: Constraints, tol: float) -> bool:
    """True when no client wants to (and may) move."""
    return all(_best_response(state, cons, n, tol) is None for n in range(state.assign.size))


def selfish_dynamics(state: PartitionState, cons: Constraints, *, tol: float, max_moves: int,
                     rng: np.random.Generator) -> DescentOutcome:
    """Seeded sweeps of best responses; Φ recorded (incrementally) after every move."""
    out = DescentOutcome(trajectory=[state.phi])
    N = state.assign.size
    while True:
        moved = False
        for n in rng.permutation(N):
            if out.moves >= max_moves:
                out.stable = selfish_check(state, cons, tol)
                return out
            a = _best_response(state, cons, int(n), tol)
            if a is None:
                continue
            ev = state.evaluate(np.array([n]), np.array([a]))
            out.evaluations += 1
            state.apply(ev, 0)
            out.moves += 1
            out.trajectory.append(state.phi)
            moved = True
        if not moved:
            out.stable = True
            return out
