"""The cloud's logic without gRPC or an event loop: :class:`cloud_server.controller.CloudController`
called directly (registration, formation, dispatch, submit accepted/refused, failover, a late
answer, progress and status, the checkpoint round trip) on a tiny synthetic federation: 4
clients, 2 edges, a 9-number model.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from fedcure_app.devices import PRESETS
from fedcure_app.protocol import cloud_pb2 as pb
from cloud_server.controller import CloudController
from cloud_server.refusal import Reason, Refusal
from cloud_server.state import ClientEntry, Phase, TaskState
from tests.deployment.fakes import SMALL_MODEL, make_cfg

HOMES = {"c1": 0, "c2": 0, "c10": 1, "c3": 1}


def controller(tmp_path=None, out_dir=None, **flat) -> CloudController:
    """``out_dir``: where the results go (None: nothing written; no plots either way)."""
    cfg = make_cfg(4, 2, **flat)
    return CloudController(cfg, expected_clients=4, initial_arrays=SMALL_MODEL,
                           checkpoint_dir=None if tmp_path is None else tmp_path / "ckpt",
                           out_dir=out_dir, write_plots=False)


def entry(name: str) -> ClientEntry:
    counts = np.array([5, 3, 0, 2], dtype=np.int64)
    return ClientEntry(name, counts, PRESETS["rpi4"], HOMES[name])


def formed(tmp_path=None, out_dir=None, **flat) -> tuple[CloudController, list[TaskState]]:
    c = controller(tmp_path, out_dir, **flat)
    for name in HOMES:
        c.register(entry(name))
    assert c.should_form(window_closed=False)
    c.start_forming()
    tasks = c.form_and_build()
    c.begin_training()
    return c, tasks


def answer(c: CloudController, task: TaskState, *, late: bool = False, shift: float = 0.1):
    """Check and apply the edge model ``global + shift`` for ``task`` as Submit does."""
    c.formed.check_submit(task, 10, 1.0, [], [])
    arrays = [a + shift for a in c.strategy.global_arrays]
    return c.formed.arrive(task, arrays, 1.5, 1.2, 10, [], [], late)


def refused(fn) -> Reason:
    with pytest.raises(Refusal) as err:
        fn()
    return err.value.reason


def test_registration_is_idempotent_and_closes_at_formation():
    c = controller()
    first = c.register(entry("c1"))
    again = c.register(entry("c1"))
    assert first is again and len(c.clients) == 1
    assert not c.should_form(window_closed=False)
    assert not c.should_form(window_closed=True)  # fewer clients than edges
    for name in ("c2", "c10", "c3"):
        c.register(entry(name))
    assert c.should_form(window_closed=False)
    c.start_forming()
    assert refused(lambda: c.register(ClientEntry("late", np.ones(4, np.int64),
                                                  PRESETS["rpi4"], None))) \
        is Reason.FAILED_PRECONDITION


def test_claims_are_stable_and_refused_when_taken():
    c = controller()
    assert c.registry.claim("a", None) == 0 and c.registry.claim("a", None) == 0
    assert c.registry.claim("b", 2) == 2
    assert refused(lambda: c.registry.claim("c", 2)) is Reason.ALREADY_EXISTS
    assert refused(lambda: c.registry.claim("a", 1)) is Reason.FAILED_PRECONDITION
    assert refused(lambda: c.registry.claim("d", 9)) is Reason.INVALID_ARGUMENT


def test_formation_gives_ids_in_natural_order_and_dispatches_round_0():
    c, tasks = formed()
    assert c.phase is Phase.TRAINING
    ids = {name: e.client_id for name, e in c.clients.items()}
    assert ids == {"c1": 0, "c2": 1, "c3": 2, "c10": 3}  # c10 after c3, not by arrival
    assert [e.name for e in c.registry.members(0)] == ["c1", "c2"]
    assert [e.name for e in c.registry.members(1)] == ["c3", "c10"]
    assert tasks and all(t.task_id in c.tasks for t in tasks)
    t = tasks[0]
    assert t.message.message.task_id == t.task_id and len(t.message.model_bytes()) > 0
    assert c.strategy.in_flight[t.dispatch.coalition] is t.dispatch


def test_an_accepted_submit_aggregates_records_and_dispatches_again():
    c, tasks = formed()
    task = tasks[0]
    before = [a.copy() for a in c.strategy.global_arrays]
    arrival = answer(c, task)
    assert task.reply.accepted and task.reply.version == 1
    assert arrival.record["round"] == 1 and arrival.record["coalition"] == task.dispatch.coalition
    assert arrival.record["latency_s"] == 1.5 and arrival.record["edge_latency_s"] == 1.2
    assert not arrival.finished
    assert arrival.record["dispatched"] == [t.dispatch.coalition for t in arrival.new]
    assert all(c.strategy.in_flight[t.dispatch.coalition] is t.dispatch for t in arrival.new)
    assert all(not np.array_equal(a, b) for a, b in zip(c.strategy.global_arrays, before))
    assert c.records == [arrival.record]
    second = answer(c, tasks[1])  # both of round 0 answered: the next round goes out
    assert second.record["round"] == 2 and second.new


def test_submits_are_refused_before_any_state_changes():
    c, tasks = formed()
    task = tasks[0]
    m = task.dispatch.coalition
    assert refused(lambda: c.find_task("r9-c0-v0", m)) is Reason.NOT_FOUND
    assert refused(lambda: c.find_task(task.task_id, 1 - m)) is Reason.INVALID_ARGUMENT
    assert refused(lambda: c.formed.check_submit(task, 0, 1.0, [], [])) is Reason.INVALID_ARGUMENT
    stranger = pb.ClientStat(client_id=99, samples=1, seconds=1.0)
    assert refused(lambda: c.formed.check_submit(task, 5, 1.0, [stranger], [])) \
        is Reason.INVALID_ARGUMENT
    answer(c, task)
    assert refused(lambda: c.formed.check_submit(task, 5, 1.0, [], [])) \
        is Reason.FAILED_PRECONDITION


def test_a_failed_arrival_rolls_everything_back(monkeypatch):
    c, tasks = formed()
    task = tasks[0]
    state = c.strategy.state_dict()

    def broken() -> None:
        raise OSError("disk full")

    monkeypatch.setattr(c.durability, "save", lambda federation: broken())
    with pytest.raises(OSError):
        answer(c, task)
    assert c.records == [] and task.reply is None
    assert c.strategy.state_dict()["version"] == state["version"] == 0
    assert set(c.tasks) == {t.task_id for t in tasks}


def test_failover_marks_the_coalition_lost_and_a_late_answer_brings_it_back():
    c, tasks = formed()
    task = tasks[0]
    m = task.dispatch.coalition
    new = c.formed.lose(m, task, "no answer within its deadline")
    assert m in c.strategy.unavailable and task.expired == "no answer within its deadline"
    assert c.faults[-1]["kind"] == "lost" and c.faults[-1]["coalition"] == m
    assert all(t.dispatch.coalition != m for t in new)
    assert c.formed.too_stale(task) is None  # version unchanged: within the staleness bound
    arrival = answer(c, task, late=True)
    assert arrival.record["late"] is True and task.reply.accepted
    assert m not in c.strategy.unavailable
    assert [f["kind"] for f in c.faults[-2:]] == ["late", "back"]


def test_take_back_makes_a_lost_coalition_schedulable():
    c, tasks = formed()
    m = tasks[0].dispatch.coalition
    c.formed.lose(m, tasks[0], "edge gone")
    c.formed.take_back(m, "its edge server connected again")
    assert m not in c.strategy.unavailable and c.faults[-1]["kind"] == "back"


def test_the_checkpoint_state_round_trips(tmp_path):
    c, tasks = formed(tmp_path)
    answer(c, tasks[0])
    assert c.checkpoints is not None and c.checkpoints.exists()
    state, models = c.checkpoints.load()
    back = controller(tmp_path)
    back.restore(state, models)
    assert back.phase is Phase.TRAINING and back.records == c.records
    assert back.strategy.version == c.strategy.version
    assert {n: e.client_id for n, e in back.clients.items()} == \
        {n: e.client_id for n, e in c.clients.items()}
    live = {t.task_id for t in c.tasks.values()
            if c.strategy.in_flight.get(t.dispatch.coalition) is t.dispatch}
    assert live and live <= set(back.tasks)
    for a, b in zip(back.strategy.global_arrays, c.strategy.global_arrays):
        np.testing.assert_array_equal(a, b)


def test_phase_values_are_the_status_replys():
    assert (int(Phase.REGISTERING), int(Phase.TRAINING), int(Phase.DONE)) == (
        pb.StatusReply.REGISTERING, pb.StatusReply.TRAINING, pb.StatusReply.DONE)


def test_a_resumed_controller_records_it_and_knows_whether_the_run_was_complete(tmp_path):
    c, tasks = formed(tmp_path / "going", **{"global-rounds": 5})
    answer(c, tasks[0])
    back = controller(tmp_path / "going", **{"global-rounds": 5})
    assert back.resume() is False and back.phase is Phase.TRAINING
    assert back.faults[-1]["kind"] == "resumed" and back.strategy.round == 1
    c, tasks = formed(tmp_path / "over", **{"global-rounds": 1})
    assert answer(c, tasks[0]).finished
    assert controller(tmp_path / "over", **{"global-rounds": 1}).resume() is True


def test_a_failed_formation_keeps_registering_until_registrations_change(monkeypatch):
    c = controller()
    for name in HOMES:
        c.register(entry(name))
    c.start_forming()
    monkeypatch.setattr(c, "build_initial_arrays", lambda: (_ for _ in ()).throw(
        RuntimeError("model build failed")))
    with pytest.raises(RuntimeError):
        c.form_and_build()
    c.formation_failed(RuntimeError("model build failed"))
    assert c.phase is Phase.REGISTERING and not c.forming and c.strategy is None
    assert all(e.client_id is None and e.edge_id is None for e in c.clients.values())
    assert c.faults[-1]["kind"] == "formation-failed"
    assert "model build failed" in c.formation_error
    assert not c.should_form(window_closed=True)  # the same registrations would fail again
    c.register(entry("c1"))  # a client calls again: worth another attempt
    assert c.should_form(window_closed=False)


def test_status_is_an_immutable_snapshot_read_without_the_lock():
    c, tasks = formed()
    answer(c, tasks[0])
    got: list = []
    with c.lock:  # a worker holds the lock (say, writing a checkpoint): status still answers
        reader = threading.Thread(target=lambda: got.append(c.status()))
        reader.start()
        reader.join(5)
        assert not reader.is_alive()
    (snap,) = got
    assert (snap.phase, snap.version, snap.round) == (Phase.TRAINING, 1, 1)
    assert snap.in_flight == tuple(sorted(c.strategy.in_flight))
    assert (snap.clients_registered, snap.expected_clients) == (4, 4)
    assert (snap.edges_connected, snap.num_edges) == (0, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.version = 7
    c.registry.edge_connected(1, "127.0.0.1:9092")
    assert c.status().edges_connected == 1 and snap.edges_connected == 0
    reply = c.status().to_proto()
    assert (reply.version, list(reply.in_flight)) == (1, list(snap.in_flight))


def test_progress_is_kept_while_its_task_is_expected():
    c, tasks = formed()
    task = tasks[0]
    m = task.dispatch.coalition
    member = task.dispatch.clients[0]
    assert c.report_progress(m, task.task_id, 1, 2, [member, 99], 3.0)
    (row,) = c.status().progress
    assert (row.coalition, row.edge_round, row.tau_e, row.waiting) == (m, 1, 2, (member,))
    assert row.elapsed_s >= 3.0
    assert refused(lambda: c.report_progress(1 - m, task.task_id, 1, 2, [], 3.0)) \
        is Reason.INVALID_ARGUMENT
    assert refused(lambda: c.report_progress(m, task.task_id, 3, 2, [], 3.0)) \
        is Reason.INVALID_ARGUMENT
    answer(c, task)
    assert not c.report_progress(m, task.task_id, 2, 2, [], 4.0)
    assert all(r.coalition != m or c.is_live(task.task_id) for r in c.status().progress)
    assert not c.report_progress(m, "r9-c9-v9", 0, 2, [], 0.0)  # unknown: not expected


def test_reported_start_up_is_left_out_of_the_latency_estimate_and_its_calibration():
    """Two clouds get the same arrival, one with 1.2 s of its 1.5 s reported as start-up (a
    trainer loading, clients coming online): that one's estimator learns 0.3 s, exactly as a
    cloud that measured 0.3 s with no start-up, and the record keeps the measured 1.5 s."""
    plain, tasks_p = formed(**{"warmup-tasks": 0})
    started, tasks_s = formed(**{"warmup-tasks": 0})
    fast, tasks_f = formed(**{"warmup-tasks": 0})
    for c, tasks, latency, startup in ((plain, tasks_p, 1.5, 0.0), (started, tasks_s, 1.5, 1.2),
                                       (fast, tasks_f, 0.3, 0.0)):
        task = tasks[0]
        c.formed.check_submit(task, 10, latency, [], [], startup)
        arrays = [a + 0.1 for a in c.strategy.global_arrays]
        rec = c.formed.arrive(task, arrays, latency, latency, 10, [], [], False, startup).record
        assert rec["latency_s"] == latency and rec["startup_s"] == startup
    est = {name: c.strategy.estimator for name, c in
           (("plain", plain), ("started", started), ("fast", fast))}
    assert est["started"].scale == pytest.approx(est["fast"].scale)
    assert est["started"].scale < est["plain"].scale
    np.testing.assert_allclose(est["started"].mean(), est["fast"].mean())
    assert started.records[0]["observed_latency_s"] == pytest.approx(0.3)


def test_each_coalitions_first_task_is_aggregated_but_not_learned_by_the_estimate():
    """Deployed, the default leaves each coalition's first task (a warm-up) out of T̂ and its
    calibration: the model and the round still advance, the record says warmup, and a
    coalition's second task is the first T̂ learns."""
    c, tasks = formed()
    assert len(tasks) == c.strategy.num_coalitions == 2
    before = c.strategy.estimator.mean().copy()
    new = []
    for i, task in enumerate(tasks):
        arrival = answer(c, task)
        assert arrival.record["warmup"] is True and c.strategy.round == i + 1
        new = arrival.new
    np.testing.assert_array_equal(c.strategy.estimator.mean(), before)
    assert c.strategy.estimator.count.sum() == 0 and c.strategy.estimator.calib_n == 0
    assert new, "a slot freed by the second arrival is refilled"
    m = new[0].dispatch.coalition
    second = answer(c, new[0])
    assert second.record["warmup"] is False
    assert c.strategy.estimator.count[m] == 1 and c.strategy.estimator.calib_n == 1


def test_a_start_up_longer_than_the_edges_latency_is_refused():
    c, tasks = formed()
    assert refused(lambda: c.formed.check_submit(tasks[0], 10, 1.0, [], [], 1.5)) \
        is Reason.INVALID_ARGUMENT
    assert refused(lambda: c.formed.check_submit(tasks[0], 10, 1.0, [], [], -0.1)) \
        is Reason.INVALID_ARGUMENT
    assert c.strategy.round == 0 and not c.records
