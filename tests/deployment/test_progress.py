"""Live progress inside a global round (issue 18): the edge reports the edge round its task is in
and the clients still training (``EdgeLink.Progress``); the cloud logs it, shows it in
``Monitor.Status`` with an ETA from the estimator, and stops taking reports of answered tasks."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_server.progress import ProgressBoard, Report, current_estimate, eta_s
from edge_server.progress import ProgressReporter
from fedcure_app.cli.launch import progress_text
from fedcure_app.flower.edge import run_edge_task
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from tests.deployment.fakes import FakeEdge, channel, make_cfg, register_request, start_cloud
from tests.simulation.fake_grid import task_identity
from tests.simulation.test_edge import NODE, grid_for, make_task


@given(st.integers(1, 500), st.floats(0.0, 1e6), st.floats(0.0, 1e7), st.data())
def test_eta_is_what_is_left_of_the_estimate_at_least_for_rounds_not_started(
        tau_e, estimate, elapsed, data):
    r = data.draw(st.integers(0, tau_e))
    eta = eta_s(r, tau_e, estimate, elapsed)
    assert 0.0 <= eta <= estimate + 1e-9
    if r == tau_e:
        assert eta == 0.0
    else:
        assert eta >= estimate * (tau_e - r - 1) / tau_e - 1e-9
        assert eta >= estimate - elapsed - 1e-9
        assert eta_s(r + 1, tau_e, estimate, elapsed) <= eta + 1e-9
        assert eta_s(r, tau_e, estimate, elapsed + 1.0) <= eta + 1e-9
    assert eta_s(0, tau_e, estimate, 0.0) == pytest.approx(estimate)


@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                         st.floats(1e-6, 1e6)), max_size=6),
       st.integers(-2, 8), st.floats(1e-6, 1e6))
def test_the_eta_counts_from_the_coalitions_estimate_now_where_it_has_one(t_hat, m, sent):
    got = current_estimate(t_hat, m, sent)
    has = 0 <= m < len(t_hat) and t_hat[m] > 0 and t_hat[m] < float("inf")
    assert got == (t_hat[m] if has else sent)


def test_a_task_sent_with_the_prior_gets_an_eta_from_the_calibrated_estimate():
    """In deployment the first measured answers rescale every coalition's prior: a task sent
    in round 0 with T^ 0.03 s whose coalition's T^ is now 3 s, 3.3 s in at edge round 1 of 2,
    has at least half of those 3 s to go (it showed 0.016 s)."""
    board = ProgressBoard(clock=lambda: 10.0)
    board.update(Report(task_id="r0-c1-v0", coalition=1, edge_round=0, tau_e=2, waiting=(1,),
                        elapsed_s=3.3, estimate_s=0.03, received_at=10.0))
    (old,) = board.snapshot(lambda task: True)
    assert old.eta_s < 0.03  # the estimate it was sent with: nothing left
    (row,) = board.snapshot(lambda task: True, estimates=[2.9, 3.0])
    assert row.eta_s == pytest.approx(1.5)
    assert row.eta_s >= 3.0 - row.elapsed_s


def _report(edge_round: int, at: float, task: str = "r1-c0-v0") -> Report:
    return Report(task_id=task, coalition=0, edge_round=edge_round, tau_e=4, waiting=(2, 5),
                  elapsed_s=at, estimate_s=40.0, received_at=at)


def test_the_board_logs_new_edge_rounds_and_repeats_itself_every_log_interval(caplog):
    board = ProgressBoard(log_every_s=15.0, clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="fedcure.cloud"):
        logged = [board.update(_report(r, t)) for r, t in
                  [(0, 0.0), (0, 10.0), (0, 16.0), (1, 17.0), (1, 20.0), (1, 40.0)]]
    assert logged == [True, False, True, True, False, True]
    assert ("coalition 0: task r1-c0-v0 edge round 2/4, waiting for clients [2, 5], 17 s in, "
            "ETA ~23 s (estimate T^ 40 s)") in caplog.messages


def test_a_task_past_its_estimate_says_by_how_much_in_the_log_line():
    from cloud_server.progress import describe

    line = describe(_report(0, 55.0))
    assert line.endswith("55 s in, ETA ~30 s (estimate T^ 40 s, 15 s past it)"), line
    assert "past it" not in describe(_report(0, 39.5))


def test_the_reporter_sends_changes_at_once_and_heartbeats_while_unchanged():
    sent: list[pb.ProgressRequest] = []
    got = threading.Event()

    def send(req, timeout):
        sent.append(req)
        got.set()
        return pb.ProgressReply(expected=True)

    rep = ProgressReporter(send, edge_id=3, token="t", heartbeat_s=0.05)
    try:
        rep.update(0, [1])  # no task yet: nothing to report
        time.sleep(0.15)
        assert sent == []
        rep.start_task("r2-c3-v1", 4)
        rep.update(1, [7, 9])
        assert got.wait(2)
        time.sleep(0.3)
        assert len(sent) >= 3, "no heartbeat while the state stayed the same"
        first = sent[0]
        assert (first.task_id, first.edge_id, first.edge_round, first.tau_e,
                list(first.training_client_ids), first.token) == ("r2-c3-v1", 3, 1, 4, [7, 9], "t")
        assert sent[-1].elapsed_s > first.elapsed_s
        rep.end_task()
        time.sleep(0.1)
        n = len(sent)
        time.sleep(0.2)
        assert len(sent) == n, "reports went on after the task ended"
    finally:
        rep.close()


def test_the_reporter_stops_when_the_cloud_lacks_the_rpc():
    calls = []

    class Unimplemented(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNIMPLEMENTED

    def send(req, timeout):
        calls.append(req)
        raise Unimplemented()

    rep = ProgressReporter(send, edge_id=0, heartbeat_s=0.02)
    try:
        rep.start_task("t", 2)
        rep.update(0, [1])
        time.sleep(0.3)
        assert len(calls) == 1
    finally:
        rep.close()


def test_run_edge_task_reports_each_round_and_who_is_still_training():
    calls: list[tuple[int, list[int]]] = []
    with task_identity():
        grid = grid_for(c2={"silent_rounds": (0,)})
        run_edge_task(grid, make_task(clients=(0, 1, 2), tau_e=2), NODE, poll_s=0.001,
                      timeout_s=0.2, on_progress=lambda r, w: calls.append((r, list(w))))
    assert calls[0] == (0, [0, 1, 2])
    assert (0, [2]) in calls, "client 2, still training, was never reported"
    assert calls[calls.index((0, [2])) + 1] == (1, [0, 1])  # client 2 dropped after round 0
    assert calls[-2:] == [(1, []), (2, [])]


def test_monitor_status_counts_the_eta_from_the_coalitions_estimate_now(cleanup):
    """A running cloud: coalition 0's first answer (no warm-up) rescales both priors; the
    task coalition 1 is still training, sent with the uncalibrated prior, then shows an ETA of
    at least what is left of its coalition's T^ now, and its share for the edge round to come."""
    server = start_cloud(make_cfg(4, 2, **{"max-concurrent": 2, "global-rounds": 9,
                                           "warmup-tasks": 0}), expected=4)
    cleanup.append(server)
    ch = channel(server.address)
    cleanup.append(ch)
    edges = [FakeEdge(server.address, m) for m in range(2)]
    cleanup.extend(edges)
    assoc = pb_grpc.AssociationStub(ch)
    futs = [assoc.Register.future(register_request(f"c{i}", [5] * 4, home=i % 2), timeout=20)
            for i in range(4)]
    [f.result() for f in futs]
    tasks = [e.next_task(timeout=20) for e in edges]
    ctl = server.service.controller
    prior = ctl.strategy_view.t_hat_s[1]
    time.sleep(1.0)
    # the report comes before the calibration, the status after it; then a new report
    req = pb.ProgressRequest(task_id=tasks[1].task_id, edge_id=1, edge_round=0, tau_e=2,
                             training_client_ids=[1], elapsed_s=1.0)
    assert pb_grpc.EdgeLinkStub(ch).Progress(req, timeout=5).expected
    assert edges[0].submit(tasks[0]).accepted
    now = ctl.strategy_view.t_hat_s[1]
    assert now > 10 * prior  # calibrated to the measured second
    for again in (False, True):
        if again:
            assert pb_grpc.EdgeLinkStub(ch).Progress(req, timeout=5).expected
        (p,) = pb_grpc.MonitorStub(ch).Status(pb.StatusRequest(), timeout=5).progress
        assert p.eta_s >= max(now - p.elapsed_s, now / 2) - 1e-6, (p, now, again)


def test_the_cloud_shows_reports_of_tasks_in_flight_and_refuses_answered_ones(cleanup, caplog):
    server = start_cloud(make_cfg(2, 1, **{"global-rounds": 3}), expected=2)
    cleanup.append(server)
    ch = channel(server.address)
    cleanup.append(ch)
    assoc = pb_grpc.AssociationStub(ch)
    futs = [assoc.Register.future(register_request(f"c{i}", [5] * 4, home=0), timeout=20)
            for i in range(2)]
    edge = FakeEdge(server.address, 0)
    cleanup.append(edge)
    [f.result() for f in futs]
    task = edge.next_task(timeout=20)
    link = pb_grpc.EdgeLinkStub(ch)
    monitor = pb_grpc.MonitorStub(ch)
    req = pb.ProgressRequest(task_id=task.task_id, edge_id=0, edge_round=1, tau_e=2,
                             training_client_ids=[1], elapsed_s=3.0)
    with caplog.at_level(logging.INFO, logger="fedcure.cloud"):
        assert link.Progress(req, timeout=5).expected
    assert any(f"coalition 0: task {task.task_id} edge round 2/2, waiting for clients [1]" in m
               for m in caplog.messages)
    (p,) = monitor.Status(pb.StatusRequest(), timeout=5).progress
    assert (p.coalition, p.edge_round, p.tau_e, list(p.training_client_ids)) == (0, 1, 2, [1])
    assert p.elapsed_s >= 3.0 and p.age_s >= 0.0 and p.eta_s >= 0.0
    assert progress_text([p]).startswith("c0 e2/2 wait[1] ~")
    with pytest.raises(grpc.RpcError) as err:  # another edge's task
        link.Progress(pb.ProgressRequest(task_id=task.task_id, edge_id=5, tau_e=2), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert edge.submit(task).accepted
    assert not link.Progress(req, timeout=5).expected
    assert list(monitor.Status(pb.StatusRequest(), timeout=5).progress) == []
