"""edge.py with a fake Grid: message contents, FedAvg weights, drops, errors, CoalitionGrid."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedcure_app.flower.edge import CoalitionGrid, EdgeTaskError, pull_replies, run_edge_task
from fedcure_app.tasks import EdgeTask, client_train_seed

from .fake_grid import FakeGrid, task_identity


@pytest.fixture(autouse=True)
def _identity():
    with task_identity():
        yield

SHAPES = [(3, 2), (4,)]
NODE = {0: 100, 1: 101, 2: 102, 3: 103}  # client -> node
SIZES = {0: 10, 1: 30, 2: 60, 3: 5}


def make_task(clients=(0, 1, 2), tau_e=2, **over) -> EdgeTask:
    base = dict(
        task_id="r3-c1", coalition=1, version=7,
        arrays=[np.zeros(s, np.float32) for s in SHAPES], clients=tuple(clients),
        frequencies_ghz={c: 1.0 + 0.1 * c for c in clients}, tau_e=tau_e, tau_c=3, lr=0.05,
        batch_size=8, seed=1234,
    )
    base.update(over)
    return EdgeTask(**base)


def trainer(client: int, *, fail_rounds=(), silent_rounds=()):
    """A fake client: adds (client + 1) to every weight, reports |D_n| = SIZES[client]."""

    def handle(msg: Message):
        conf = msg.content["config"]
        r = int(conf["edge-round"])
        if r in fail_rounds:
            return Error(code=0, reason=f"client {client} crashed")
        if r in silent_rounds:
            return None
        arrays = [a + (client + 1) for a in msg.content["arrays"].to_numpy_ndarrays()]
        return RecordDict({
            "arrays": ArrayRecord(arrays),
            "metrics": MetricRecord({
                "num-examples": SIZES[client], "samples": 24, "seconds": 0.5 + client,
                "f-applied-ghz": float(conf["freq-ghz"]), "loss": 2.0 - 0.1 * r,
            }),
        })

    return handle


def grid_for(**per_client) -> FakeGrid:
    return FakeGrid({NODE[c]: trainer(c, **per_client.get(f"c{c}", {})) for c in NODE})


def expected_after(rounds_clients: list[list[int]]) -> float:
    """The value of every weight after FedAvg rounds over the given clients (start 0)."""
    v = 0.0
    for clients in rounds_clients:
        w = np.array([SIZES[c] for c in clients], float)
        v = float(np.dot(w / w.sum(), [v + c + 1 for c in clients]))
    return v


def test_one_message_per_client_per_round_with_its_own_directive_and_seed():
    grid = grid_for()
    task = make_task()
    res = run_edge_task(grid, task, NODE, poll_s=0.001)
    assert len(grid.sent) == 3 * 2
    contents = {id(m.content) for m in grid.sent}
    assert len(contents) == 6  # a RecordDict per message, not one shared
    for m in grid.sent:
        conf = m.content["config"]
        c, r = int(conf["client-id"]), int(conf["edge-round"])
        assert m.metadata.dst_node_id == NODE[c]
        assert m.metadata.message_type == "train"
        assert conf["seed"] == client_train_seed(task.seed, r, c)
        assert conf["freq-ghz"] == pytest.approx(task.frequencies_ghz[c])
        assert (conf["tau-c"], conf["lr"], conf["batch-size"]) == (3, 0.05, 8)
        assert conf["task-id"] == "r3-c1"
        # the model travels packed: one flat array of all SHAPES' values
        # (fedcure_app.flower.packing)
        (flat,) = m.content["arrays"].to_numpy_ndarrays()
        assert flat.shape == (sum(int(np.prod(s)) for s in SHAPES),)
    assert res.dropped == []
    assert res.num_samples == SIZES[0] + SIZES[1] + SIZES[2]
    want = expected_after([[0, 1, 2], [0, 1, 2]])
    for a, s in zip(res.arrays, SHAPES):
        assert isinstance(a, np.ndarray) and a.shape == s
        np.testing.assert_allclose(a, want, rtol=1e-6)
    assert [(r.client, r.edge_round) for r in res.reports] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert res.reports[4].seconds == 1.5 and res.reports[4].f_applied_ghz == pytest.approx(1.1)
    assert res.reports[3].loss == pytest.approx(1.9)
    assert grid.repulls == 0


def test_aggregation_is_flowers_fedavg():
    """Same numbers as FedAvg.aggregate_train applied to the replies directly."""
    grid = grid_for()
    res = run_edge_task(grid, make_task(tau_e=1), NODE, poll_s=0.001)
    g2 = grid_for()
    msgs = [Message(RecordDict({"arrays": ArrayRecord([np.zeros(s, np.float32) for s in SHAPES]),
                                "config": ConfigRecord({"edge-round": 0, "freq-ghz": 1.0})}),
                    NODE[c], "train") for c in (0, 1, 2)]
    ids = g2.push_messages(msgs)
    replies = g2.pull_messages(ids)
    arrays, _ = FedAvg().aggregate_train(1, replies)
    for a, b in zip(res.arrays, arrays.to_numpy_ndarrays()):
        np.testing.assert_array_equal(a, b)


def test_error_reply_drops_the_client_and_renormalises_the_weights():
    grid = grid_for(c1={"fail_rounds": (0,)})
    res = run_edge_task(grid, make_task(), NODE, poll_s=0.001)
    assert res.dropped == [1]
    want = expected_after([[0, 2], [0, 2]])
    np.testing.assert_allclose(res.arrays[0], want, rtol=1e-6)
    # the dropped client gets no further rounds of this task
    assert [int(m.content["config"]["client-id"]) for m in grid.sent] == [0, 1, 2, 0, 2]
    assert res.num_samples == SIZES[0] + SIZES[2]
    assert {(r.client, r.edge_round) for r in res.reports} == {(0, 0), (2, 0), (0, 1), (2, 1)}


def test_drop_in_a_later_round():
    grid = grid_for(c2={"fail_rounds": (1,)})
    res = run_edge_task(grid, make_task(), NODE, poll_s=0.001)
    assert res.dropped == [2]
    np.testing.assert_allclose(res.arrays[1], expected_after([[0, 1, 2], [0, 1]]), rtol=1e-6)


def test_timeout_drops_the_silent_client():
    grid = grid_for(c0={"silent_rounds": (0,)})
    res = run_edge_task(grid, make_task(), NODE, poll_s=0.001, timeout_s=0.05)
    assert res.dropped == [0]
    np.testing.assert_allclose(res.arrays[0], expected_after([[1, 2], [1, 2]]), rtol=1e-6)


def test_client_without_a_node_is_dropped():
    grid = grid_for()
    res = run_edge_task(grid, make_task(clients=(0, 1, 9)), NODE, poll_s=0.001)
    assert res.dropped == [9]
    np.testing.assert_allclose(res.arrays[0], expected_after([[0, 1], [0, 1]]), rtol=1e-6)


def test_none_answered_raises_a_clear_error():
    grid = grid_for(c0={"fail_rounds": (0,)}, c1={"fail_rounds": (0,)})
    with pytest.raises(EdgeTaskError, match=r"no client answered edge round 0 .*client 0: error "
                                            r"reply: client 0 crashed"):
        run_edge_task(grid, make_task(clients=(0, 1)), NODE, poll_s=0.001)


def test_none_answered_in_time_raises():
    grid = grid_for(c0={"silent_rounds": (0,)})
    with pytest.raises(EdgeTaskError, match="no reply within 0.02 s"):
        run_edge_task(grid, make_task(clients=(0,)), NODE, poll_s=0.001, timeout_s=0.02)


def test_malformed_reply_is_a_drop():
    def bad(msg):
        return RecordDict({"metrics": MetricRecord({"num-examples": 3})})

    def wrong_model(msg):
        return RecordDict({"arrays": ArrayRecord([np.zeros(3, np.float32)]),
                           "metrics": MetricRecord({"num-examples": 3, "samples": 1,
                                                    "seconds": 0.1, "f-applied-ghz": 1.0,
                                                    "loss": 1.0})})

    grid = grid_for()
    grid.handlers[NODE[2]] = bad
    grid.handlers[NODE[1]] = wrong_model
    res = run_edge_task(grid, make_task(tau_e=1), NODE, poll_s=0.001)
    assert res.dropped == [1, 2]
    np.testing.assert_allclose(res.arrays[0], expected_after([[0]]), rtol=1e-6)


def test_pull_replies_never_asks_again_for_an_answered_id():
    grid = grid_for()
    grid.delay_pulls = 3
    msgs = [Message(RecordDict({"arrays": ArrayRecord([np.zeros(2, np.float32)]),
                                "config": ConfigRecord({"edge-round": 0, "freq-ghz": 1.0})}),
                    NODE[c], "train") for c in (0, 1)]
    ids = grid.push_messages(msgs)
    got, pending = pull_replies(grid, ids, poll_s=0.0001)
    assert set(got) == set(ids) and not pending
    assert grid.pulls == 4 and grid.repulls == 0


def test_a_pull_that_runs_past_the_deadline_is_followed_by_one_last_pull():
    """Flower's pull can block on one reply's missing objects (its client died uploading) until
    past the edge timeout; the replies that came in meanwhile still count."""
    from types import SimpleNamespace

    now = [0.0]

    def reply(mid: str):
        return SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid))

    class SlowGrid:
        calls = 0

        def pull_messages(self, ids):
            self.calls += 1
            if self.calls == 1:
                now[0] += 100.0  # blocked far past the 60 s deadline
                return [reply("dead")]  # the dead client's error reply
            return [reply(i) for i in ids if i == "alive"]  # answered while we were blocked

    grid = SlowGrid()
    got, pending = pull_replies(grid, ["dead", "alive", "silent"], poll_s=0.01, timeout_s=60,
                                sleep=lambda s: None, clock=lambda: now[0])
    assert set(got) == {"dead", "alive"} and pending == {"silent"}
    assert grid.calls == 2  # one last pull, then it gives up


def test_coalition_grid_restricts_nodes():
    grid = grid_for()
    cg = CoalitionGrid(grid, [NODE[1], NODE[3], 999])
    assert cg.get_node_ids() == [NODE[1], NODE[3]]  # 999 is not registered
    assert cg.coalition_node_ids == (NODE[1], NODE[3], 999)
    # a Message-API strategy samples only the coalition
    strat = FedAvg(min_available_nodes=1, min_train_nodes=1)
    msgs = strat.configure_train(1, ArrayRecord([np.zeros(2, np.float32)]),
                                 ConfigRecord({"edge-round": 0, "freq-ghz": 1.0}), cg)
    assert sorted(m.metadata.dst_node_id for m in msgs) == [NODE[1], NODE[3]]
    with pytest.raises(ValueError, match="not in this coalition"):
        cg.push_messages([Message(RecordDict(), NODE[0], "train")])
    ids = cg.push_messages(msgs)
    assert len(cg.pull_messages(ids)) == 2
    replies = cg.send_and_receive(
        strat.configure_train(2, ArrayRecord([np.zeros(2, np.float32)]),
                              ConfigRecord({"edge-round": 0, "freq-ghz": 1.0}), cg),
        timeout=1.0)
    assert sorted(r.metadata.src_node_id for r in replies) == [NODE[1], NODE[3]]


def test_run_edge_task_on_a_coalition_grid():
    grid = grid_for()
    cg = CoalitionGrid(grid, [NODE[0], NODE[2]])
    res = run_edge_task(cg, make_task(clients=(0, 2)), NODE, poll_s=0.001)
    assert res.dropped == []
    with pytest.raises(ValueError, match="not in this coalition"):
        run_edge_task(cg, make_task(clients=(0, 1)), NODE, poll_s=0.001)


def test_extra_config_reaches_every_message():
    grid = grid_for()
    run_edge_task(grid, make_task(tau_e=1), NODE, poll_s=0.001, extra_config={"data-key": "ab"})
    assert all(m.content["config"]["data-key"] == "ab" for m in grid.sent)


def test_each_rounds_slowest_client_start_up_adds_to_the_tasks_start_up():
    """Clients report start-up inside a message as ``startup-s``; a round waits for its slowest
    start-up, so the task's start-up is the sum over rounds of each round's largest one."""
    startup = {(0, 0): 1.5, (1, 0): 0.25, (2, 1): 0.5}  # (client, edge round) -> seconds

    def with_startup(client: int):
        inner = trainer(client)

        def handle(msg: Message):
            out = inner(msg)
            r = int(msg.content["config"]["edge-round"])
            out["metrics"]["startup-s"] = startup.get((client, r), 0.0)
            return out

        return handle

    grid = FakeGrid({NODE[c]: with_startup(c) for c in NODE})
    res = run_edge_task(grid, make_task(tau_e=3), NODE, poll_s=0.001)
    assert res.dropped == []
    assert res.startup_s == pytest.approx(1.5 + 0.5)
    plain = run_edge_task(grid_for(), make_task(tau_e=3), NODE, poll_s=0.001)
    assert plain.startup_s == 0.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_reply_with_a_bad_start_up_is_a_drop(bad):
    def reporting(client: int, value: float):
        inner = trainer(client)

        def handle(msg):
            out = inner(msg)
            out["metrics"]["startup-s"] = value
            return out

        return handle

    grid = FakeGrid({NODE[c]: reporting(c, bad if c == 1 else 0.0) for c in NODE})
    res = run_edge_task(grid, make_task(tau_e=1), NODE, poll_s=0.001)
    assert res.dropped == [1] and res.startup_s == 0.0
