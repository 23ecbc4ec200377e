"""Noticing a lost edge server: task deadlines from the latency estimator.

A task for coalition m must be answered within

    deadline = max(deadline_min_s, deadline_slack × Q_q(T_m))

seconds of its dispatch (and at least ``first_deadline_s`` while no task of any coalition has
been answered: until then Q_q rests on the device profiles' guess alone, which can be off by
orders of magnitude on a real host), where Q_q(T_m) is the q-quantile (``deadline_quantile``) of the
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
    floor = rel.deadline_min_s
    if estimator.calib_n == 0:  # nothing observed yet, anywhere
        floor = max(floor, rel.first_deadline_s)
    return max(floor, rel.deadline_slack * q)


def overdue(dispatched_at: float, deadline_s: float, now: float) -> bool:
    """True when a task dispatched at ``dispatched_at`` (monotonic s) has passed its deadline."""
    return now - dispatched_at > deadline_s


__all__ = ["overdue", "task_deadline_s"]
