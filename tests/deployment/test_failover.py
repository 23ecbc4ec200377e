"""An edge server dies mid-task (kill -9): the cloud notices by the estimator's deadline, marks
its coalition unavailable, trains on with the others, and takes it back when it reconnects."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_server.failover import overdue, task_deadline_s
from fedcure_app.config import ReliabilityConfig
from fedcure_app.core.estimator import LatencyEstimator
from tests.deployment.fakes import make_cfg
from tests.deployment.reliability import (
    TIMED,
    Proc,
    one_hot,
    register_all,
    request,
    start,
    wait_until,
)


@settings(max_examples=60, deadline=None)
@given(prior=st.floats(0.01, 100.0), obs=st.lists(st.floats(0.01, 100.0), max_size=8),
       q=st.floats(0.5, 0.999), slack=st.floats(1.0, 5.0), floor=st.floats(0.1, 10.0),
       first=st.floats(0.1, 1000.0))
def test_deadline_is_slack_times_the_latency_quantile(prior, obs, q, slack, floor, first):
    est = LatencyEstimator(np.array([prior, prior]))
    for x in obs:
        est.update(0, x)
    rel = ReliabilityConfig(deadline_quantile=q, deadline_slack=slack, deadline_min_s=floor,
                            first_deadline_s=first)
    d = task_deadline_s(est, 0, rel)
    # until some task was answered the prior alone is a guess: at least first_deadline_s
    lowest = floor if obs else max(floor, first)
    assert math.isclose(d, max(lowest, slack * est.quantile(0, q)), rel_tol=1e-12)
    # the coalition finishes within its deadline with probability >= q
    assert est.prob_within(0, d) >= q - 1e-9
    tighter = ReliabilityConfig(deadline_quantile=q, deadline_slack=1.0, deadline_min_s=floor,
                                first_deadline_s=first)
    assert task_deadline_s(est, 0, tighter) <= d
    assert overdue(0.0, d, d + 1e-6) and not overdue(0.0, d, d)


def edge(address: str, m: int, delay: float) -> Proc:
    return Proc("-m", "tests.deployment.edge_proc", "--cloud", address, "--edge-id", str(m),
                "--delay", str(delay), "--insecure", "--lifetime", "120")


def test_a_killed_edge_is_dropped_and_taken_back(cleanup):
    cfg = make_cfg(6, 3, **{"global-rounds": 10_000, "max-concurrent": 3,
                            "deadline-min-s": 1.0, "deadline-slack": 2.0,
                            "first-deadline-s": 1.0})
    server = start(cfg, expected=6)
    cleanup.append(server)
    svc = server.service.controller
    edges = [edge(server.address, m, 0.15) for m in range(3)]
    cleanup.extend(edges)
    # register once every ES is up, so that round 0's short deadlines start with them
    wait_until(lambda: all(e.connected.is_set() for e in server.service.edges.values()), 60)
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % 3, profile=TIMED)
                                  for i in range(6)], timeout=60)
    wait_until(lambda: svc.strategy is not None and svc.strategy.participation.min() >= 2, 60)

    # edge 0 dies while it holds a task (K = M: every coalition is always in flight)
    edges[0].wait_for(r"^task ")
    edges[0].kill()
    assert 0 in svc.strategy.in_flight
    wait_until(lambda: 0 in svc.strategy.unavailable, 20)
    lost = [f for f in svc.faults if f["kind"] == "lost"]
    assert lost and lost[-1]["coalition"] == 0 and "deadline" in lost[-1]["detail"]
    assert 0 not in svc.strategy.in_flight

    # training goes on with the others
    mark = len(svc.records)
    wait_until(lambda: len(svc.records) >= mark + 6, 30)
    assert {r["coalition"] for r in svc.records[mark:]} <= {1, 2}
    assert 0 in svc.strategy.unavailable

    # the ES comes back: it is scheduled again and its updates are aggregated
    edges[0] = edge(server.address, 0, 0.15)
    cleanup.append(edges[0])
    wait_until(lambda: 0 not in svc.strategy.unavailable, 30)
    assert any(f["kind"] == "back" and f["coalition"] == 0 for f in svc.faults)
    back = len(svc.records)
    wait_until(lambda: any(r["coalition"] == 0 for r in svc.records[back:]), 30)
    # every round's version is the previous one plus one: nothing applied twice or lost
    assert [r["version"] for r in svc.records] == list(range(1, len(svc.records) + 1))
    assert all(r["staleness"] >= 0 for r in svc.records)


def test_an_idle_edge_that_leaves_is_not_scheduled(cleanup):
    """With K < M an idle ES that disconnects is taken out at once and back when it returns."""
    cfg = make_cfg(4, 2, **{"global-rounds": 10_000, "max-concurrent": 1,
                            "deadline-min-s": 30.0})
    server = start(cfg, expected=4)
    cleanup.append(server)
    svc = server.service.controller
    e0 = edge(server.address, 0, 0.05)
    cleanup.append(e0)
    from tests.deployment.fakes import FakeEdge

    e1 = FakeEdge(server.address, 1)  # in-process: answers only when told
    cleanup.append(e1)
    wait_until(lambda: all(e.connected.is_set() for e in server.service.edges.values()), 60)
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % 2, profile=TIMED)
                                  for i in range(4)], timeout=60)
    # round 0 dispatches both; answer edge 1's first task, then leave while idle
    assert e1.submit(e1.next_task()).accepted
    wait_until(lambda: 1 not in svc.strategy.in_flight, 20)
    e1.close()
    wait_until(lambda: 1 in svc.strategy.unavailable, 20)
    mark = len(svc.records)
    wait_until(lambda: len(svc.records) >= mark + 5, 30)
    assert {r["coalition"] for r in svc.records[mark:]} == {0}
    e1 = FakeEdge(server.address, 1)
    cleanup.append(e1)
    wait_until(lambda: 1 not in svc.strategy.unavailable, 20)


def test_a_late_answer_is_aggregated_as_a_stale_update_within_the_bound(cleanup):
    """Issue 18: the answer to an expired task is aggregated with ξ = ℓ·k^φ while its staleness
    φ is within late-staleness-bound, recorded as late (record and faults); past the bound it
    is refused and changes nothing."""
    from fedcure_app.core.aggregation import staleness_weight
    from tests.deployment.fakes import FakeEdge
    from tests.deployment.reliability import FAST, code_of, state_of

    import grpc

    cfg = make_cfg(4, 2, **{"global-rounds": 10_000, "max-concurrent": 2,
                            "deadline-min-s": 0.5, "deadline-slack": 1.0,
                            "first-deadline-s": 0.5, "late-staleness-bound": 2})
    server = start(cfg, expected=4)
    cleanup.append(server)
    svc = server.service.controller
    e0, e1 = FakeEdge(server.address, 0), FakeEdge(server.address, 1)
    cleanup.extend([e0, e1])
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % 2, profile=FAST)
                                  for i in range(4)])
    t0 = e0.next_task()
    assert t0.version == 0
    assert e1.submit(e1.next_task(), value=0.2).accepted  # version 1
    wait_until(lambda: 0 in svc.strategy.unavailable, 20)  # t0's deadline passed
    assert e1.submit(e1.next_task(), value=0.3).accepted  # version 2: t0 is 2 versions stale

    before = state_of(server)
    reply = e0.submit(t0, value=0.9)
    assert reply.accepted and "late" in reply.detail
    rec = svc.records[-1]
    phi = before["version"] - t0.version
    assert (rec["coalition"], rec["staleness"], rec["late"]) == (0, phi, True)
    assert rec["xi"] == staleness_weight(phi, cfg.method.ell, cfg.method.k)
    assert rec["version"] == before["version"] + 1
    assert any(f["kind"] == "late" and f["coalition"] == 0 for f in svc.faults)
    assert 0 not in svc.strategy.unavailable  # taken back
    assert e0.submit(t0, value=0.9) == reply  # a duplicate: the same reply, applied once
    assert [r["version"] for r in svc.records] == list(range(1, len(svc.records) + 1))

    # coalition 0 trains again; its next task expires too and answers 3 versions late
    t1 = e0.next_task()
    wait_until(lambda: 0 in svc.strategy.unavailable, 20)
    while svc.strategy.version - t1.version <= 2:
        assert e1.submit(e1.next_task(), value=0.3).accepted
    before = state_of(server)
    records = len(svc.records)
    assert code_of(lambda: e0.submit(t1, value=0.9)) == grpc.StatusCode.FAILED_PRECONDITION
    after = state_of(server)
    assert (after["version"], after["model"], after["records"]) == (
        before["version"], before["model"], before["records"])
    assert len(svc.records) == records and not svc.records[-1]["late"]
