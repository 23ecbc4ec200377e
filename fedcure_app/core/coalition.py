"""Coalition formation: assign N clients to M edge servers (ESs) before training.

Preference rules (a client n moves from coalition b to a only when its rule says so):

- ``fedcure`` (coalition-friendly, the paper's Algorithm 1): the move must lower the potential
  Φ = average pairwise JSD of the whole partition (Eq. 3). An exact potential game: Φ falls with
  every move, so the process stops at a stable partition.
- ``pareto``: a ``fedcure`` move that also leaves neither coalition a nor b with a higher mean JSD
  to the other coalitions (so Φ still falls and the process still stops).
- ``selfish``: self-centred as in reputation-aware hedonic games; see
  :mod:`fedcure_app.core.selfish`. May cycle; bounded by ``max_moves``.

**Stable** (``FormationResult.stable``) means: at the returned partition no single allowed move
(reachable ES, below its capacity, not emptying the client's coalition of clients or samples) is
accepted by the rule, where "lowers Φ" means by more than ``tol`` nats (default 1e-12). For
``fedcure`` and ``pareto`` this is established by an exact incremental evaluation of every
allowed move, except that on large instances moves whose rigorous lower bound on ΔΦ
(:mod:`fedcure_app.core.screening`) is ≥ −tol/2 are ruled out by the bound. For ``selfish`` it
means a full sweep in which nobody wants to move.

``cluster_coalitions`` (K-Means / Mean-Shift) is the paper's clustering baseline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcure_app.core._checks import choice, counts_matrix, finite_float, index_vector, positive_int
from fedcure_app.core.clustering import cluster_coalitions
from fedcure_app.core.constraints import Constraints
from fedcure_app.core.descent import sweep_check, sweep_descent
from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts
from fedcure_app.core.partition_state import PartitionState
from fedcure_app.core.screened import certify, screened_descent
from fedcure_app.core.selfish import selfish_check, selfish_dynamics

__all__ = [
    "FormationResult",
    "RULES",
    "ALL_RULES",
    "form_coalitions",
    "run_formation",
    "is_stable",
    "cluster_coalitions",
    "coalition_label_counts",
    "average_pairwise_jsd",
]

log = logging.getLogger(__name__)

#: Preference rules of :func:`form_coalitions`.
RULES = ("fedcure", "selfish", "pareto")
#: Every formation rule of :func:`run_formation` (matches the configuration's ``formation``).
ALL_RULES = ("fedcure", "selfish", "pareto", "kmeans", "meanshift", "none")

#: Above this N·M²·C the fedcure rule screens candidates by bound instead of sweeping clients.
SWEEP_WORK_LIMIT = 20_000_000


@dataclass
class FormationResult:
    """Outcome of coalition formation.

    ``assignment`` (N,) int64 ES per client; ``jsd_trajectory`` Φ (nats) initially and after every
    accepted move; ``moves`` accepted moves (for clustering/none: clients whose ES changed);
    ``stable`` see the module docstring; ``evaluations`` exact incremental move evaluations;
    ``history`` (client, from ES, to ES) of every accepted move, in order.
    """

    assignment: np.ndarray
    jsd_trajectory: list[float]
    moves: int
    stable: bool
    rule: str = "fedcure"
    evaluations: int = 0
    history: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def initial_jsd(self) -> float:
        """Φ of the initial partition (nats)."""
        return float(self.jsd_trajectory[0])

    @property
    def final_jsd(self) -> float:
        """Φ of the returned partition (nats)."""
        return float(self.jsd_trajectory[-1])

    @property
    def num_edges(self) -> int:
        return int(self.assignment.max()) + 1 if self.assignment.size else 0

    def coalitions(self, num_edges: int | None = None) -> list[list[int]]:
        """Client ids per ES."""
        m = self.num_edges if num_edges is None else num_edges
        return [np.flatnonzero(self.assignment == e).tolist() for e in range(m)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary."""
        return {
            "rule": self.rule,
            "initial_jsd": self.initial_jsd,
            "final_jsd": self.final_jsd,
            "moves": int(self.moves),
            "stable": bool(self.stable),
            "evaluations": int(self.evaluations),
            "jsd_trajectory": [float(x) for x in self.jsd_trajectory],
            "assignment": [int(x) for x in self.assignment],
            "history": [[int(n), int(b), int(a)] for n, b, a in self.history],
        }


def _prepare(label_counts, initial, num_edges, allowed, capacity):
    counts = counts_matrix(label_counts)
    m = positive_int(num_edges, "num_edges")
    n = counts.shape[0]
    if m > n:
        raise ValueError(f"num_edges ({m}) > number of clients ({n}): every ES needs a client")
    assign = index_vector(initial, "initial", n, m)
    cons = Constraints.build(n, m, allowed, capacity)
    cons.check(assign)
    empty = np.flatnonzero(np.bincount(assign, minlength=m) == 0)
    if empty.size:
        raise ValueError(f"initial assignment leaves ES {int(empty[0])} without clients")
    return counts, assign, m, cons


def form_coalitions(
    label_counts,
    initial,
    num_edges: int,
    rule: str = "fedcure",
    *,
    allowed=None,
    capacity=None,
    max_moves: int | None = None,
    seed: int = 0,
    tol: float = 1e-12,
    method: str = "auto",
) -> FormationResult:
    """Run a preference rule from ``initial`` until stable (or ``max_moves`` moves).

    ``label_counts`` (N, C) per-client label counts; ``initial`` (N,) starting ES per client;
    ``allowed`` (N, M) bool or per-client lists of reachable ESs; ``capacity`` int or (M,) max
    clients per ES; ``max_moves`` None = until stable (``selfish``: 20·N); ``tol`` the smallest
    Φ decrease (nats) that counts; ``method`` for ``fedcure``: ``sweep`` (client by client,
    Algorithm 1), ``screened`` (bound-screened, for large N·M) or ``auto`` (by problem size).
    Deterministic for a given ``seed``.
    """
    rule = choice(rule, "formation rule", RULES)
    method = choice(method, "formation method", ("auto", "sweep", "screened"))
    counts, assign, m, cons = _prepare(label_counts, initial, num_edges, allowed, capacity)
    if max_moves is not None:
        max_moves = positive_int(max_moves, "max_moves", minimum=0)
    tol = finite_float(tol, "tol", low=0.0)
    seed = positive_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    state = PartitionState(counts, assign, m)
    n, c = counts.shape
    if rule == "selfish":
        limit = 20 * n if max_moves is None else max_moves
        out = selfish_dynamics(state, cons, tol=tol, max_moves=limit, rng=rng)
    elif rule == "fedcure" and (
        method == "screened" or (method == "auto" and n * m * m * c > SWEEP_WORK_LIMIT)
    ):
        out = screened_descent(state, cons, tol=tol, max_moves=max_moves, rng=rng)
    else:
        out = sweep_descent(state, cons, rule, tol=tol, max_moves=max_moves, rng=rng)
    log.info("formation %s: %d moves, JSD %.4f -> %.4f, stable=%s", rule, out.moves,
             out.trajectory[0], out.trajectory[-1], out.stable)
    return FormationResult(
        assignment=state.assign.copy(),
        jsd_trajectory=[float(x) for x in out.trajectory],
        moves=out.moves,
        stable=bool(out.stable),
        rule=rule,
        evaluations=out.evaluations,
        history=list(state.history),
    )


def is_stable(label_counts, assignment, num_edges: int, rule: str = "fedcure", *,
              allowed=None, capacity=None, tol: float = 1e-12) -> bool:
    """Whether no single allowed move of ``assignment`` is accepted by ``rule`` (see module doc).

    The assignment must itself respect ``allowed`` and ``capacity``.
    """
    rule = choice(rule, "formation rule", RULES)
    counts, assign, m, cons = _prepare(label_counts, assignment, num_edges, allowed, capacity)
    tol = finite_float(tol, "tol", low=0.0)
    state = PartitionState(counts, assign, m)
    if rule == "selfish":
        return selfish_check(state, cons, tol)
    n, c = counts.shape
    if rule == "fedcure" and n * m * m * c > SWEEP_WORK_LIMIT:
        return certify(state, cons, tol)[0]
    return sweep_check(state, cons, rule, tol)[0]


def run_formation(label_counts, initial, num_edges: int, rule: str = "fedcure", *,
                  allowed=None, capacity=None, max_moves: int | None = None,
                  seed: int = 0) -> FormationResult:
    """Any formation rule (:data:`ALL_RULES`) as a :class:`FormationResult`.

    For ``kmeans``/``meanshift`` (which ignore ``allowed``/``capacity``/``max_moves``) and ``none``
    (keep ``initial``) the trajectory is [Φ(initial), Φ(result)], ``moves`` counts clients whose
    ES changed, and ``stable`` says whether the result happens to be stable under the ``fedcure``
    rule.
    """
    rule = choice(rule, "formation rule", ALL_RULES)
    if rule in RULES:
        return form_coalitions(label_counts, initial, num_edges, rule, allowed=allowed,
                               capacity=capacity, max_moves=max_moves, seed=seed)
    counts, assign, m, _ = _prepare(label_counts, initial, num_edges, None, None)
    if rule == "none":
        result = assign.copy()
    else:
        result = cluster_coalitions(counts, m, method=rule, seed=seed)
    phi0 = average_pairwise_jsd(coalition_label_counts(counts, assign, m))
    phi1 = average_pairwise_jsd(coalition_label_counts(counts, result, m))
    return FormationResult(
        assignment=result,
        jsd_trajectory=[phi0, phi1],
        moves=int(np.sum(result != assign)),
        stable=is_stable(counts, result, m, "fedcure"),
        rule=rule,
    )
