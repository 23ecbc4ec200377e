"""Noticing a lost edge server: task deadlines from the latency estimator.

A task for coalition m must be answered within

    deadline = max(deadline_min_s, deadline_slack × Q_q(T_m))

seconds of its dispatch, where Q_q(T_m) is the q-quantile (``deadline_quantile``) of the
estimator's posterior predictive latency of coalition m. Past it, the cloud marks the coalition
unavailable (the strategy drops its in-flight task), fills the freed slot from the others without
closing a round, and takes the coalition back when its ES connects again or answers late.
"""

from __future__ import annotations

import math

from fedcure_app.config import ReliabilityConfig
from fedcure_app.core.estimator import LatencyEstimator


def task_deadline_s(estimator: LatencyEstimator, m: int, rel: ReliabilityConfig) -> float:
    """Seconds coalition m may take for one task before it counts as lost."""
    q = estimator.quantile(m, rel.deadline_quantile)
    if not math.isfinite(q):
        return math.inf
    return max(rel.deadline_min_s, rel.deadline_slack * q)


def overdue(dispatched_at: float, deadline_s: float, now: float) -> bool:
    """True when a task dispatched at ``dispatched_at`` (monotonic s) has passed its deadline."""
    return now - dispatched_at > deadline_s


__all__ = ["overdue", "task_deadline_s"]
