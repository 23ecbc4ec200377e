"""The cloud's federated evaluation with fake edges over real gRPC: evaluation tasks at
formation, every eval_every rounds and at the end, Evaluated answers summed per version onto
the round's record, a bounded wait for the final model, refusals; and EdgeStreams' order."""

from __future__ import annotations

import asyncio
import json
import queue
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_server.edge_streams import EdgeStreams
from cloud_server.fedeval import combine
from cloud_server.server import CloudServer
from cloud_server.service import CloudService
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import evaluation_to_proto
from fedcure_app.tasks import EvalSums
from tests.deployment.fakes import SMALL_MODEL, FakeEdge, make_cfg, register_request
from tests.deployment.test_cloud import one_hot, register_all, status

CLASSES = 4


def sums(correct: tuple[int, ...], total: tuple[int, ...], loss: float = 1.0) -> EvalSums:
    return EvalSums(sum(total), loss * sum(total), sum(correct), correct, total)


#: what each client "measured" on its held-out part (clients 0, 2 at edge 0; 1, 3 at edge 1)
HELD = {0: sums((3, 0, 0, 0), (4, 1, 0, 0), 0.5), 1: sums((0, 2, 0, 0), (0, 2, 0, 0), 2.0),
        2: sums((0, 0, 5, 1), (1, 0, 6, 2), 1.0), 3: sums((0, 0, 0, 0), (0, 0, 0, 3), 3.0)}


class Edge:
    """A fake edge that sorts its stream into training and evaluation tasks."""

    def __init__(self, address: str, m: int, token: str = "") -> None:
        self.fake = FakeEdge(address, m, token=token)
        self.stub = pb_grpc.EdgeLinkStub(self.fake.channel)

    def next(self, evaluate: bool, timeout: float = 10.0) -> pb.Task:
        """The next task of the kind asked for (others are kept for later)."""
        end = time.monotonic() + timeout
        while True:
            t = self.fake.tasks.get(timeout=max(0.01, end - time.monotonic()))
            if t.evaluate == evaluate:
                return t
            self.fake.tasks.put(t)
            time.sleep(0.01)

    def evaluated(self, task: pb.Task, clients: dict[int, EvalSums], missing=(), **over
                  ) -> pb.EvaluatedReply:
        req = pb.EvaluatedRequest(
            task_id=task.task_id, edge_id=over.pop("edge_id", self.fake.edge_id),
            version=task.version,
            clients=[evaluation_to_proto(c, s) for c, s in clients.items()],
            missing_client_ids=list(missing))
        for k, v in over.items():
            setattr(req, k, v)
        return self.stub.Evaluated(req, timeout=10)


def federation(cleanup, tmp_path: Path | None, *, rounds: int = 3, wait_s: float = 20.0,
               federated: bool = True):
    cfg = make_cfg(4, 2, **{"global-rounds": rounds, "eval-every": 2, "max-concurrent": 2,
                            "num-classes": CLASSES})
    service = CloudService(cfg, expected_clients=4, out_dir=tmp_path, register_timeout_s=20,
                           initial_arrays=SMALL_MODEL, write_plots=False,
                           federated_evaluation=federated, final_eval_wait_s=wait_s)
    server = CloudServer(service, "127.0.0.1:0")
    server.start()
    cleanup.append(server)
    edges = [Edge(server.address, m) for m in range(2)]
    cleanup.extend(e.fake for e in edges)
    register_all(server.address, [register_request(f"client-{i}", one_hot(i), home=i % 2)
                                  for i in range(4)])
    return server, edges


def part(*clients: int) -> dict[int, EvalSums]:
    return {c: HELD[c] for c in clients}


def test_evaluations_land_on_their_rounds_and_sum_to_the_clients_sample_weighted_accuracy(
        cleanup, tmp_path: Path):
    server, (e0, e1) = federation(cleanup, tmp_path)
    c = server.service.controller
    # the initial model, at formation: every edge gets its coalition's evaluation task
    init = [e.next(evaluate=True) for e in (e0, e1)]
    assert [list(t.client_ids) for t in init] == [[0, 2], [1, 3]]
    assert all(t.version == 0 and t.model for t in init)
    assert e0.evaluated(init[0], part(0, 2)).accepted
    assert e1.evaluated(init[1], part(1), missing=[3]).accepted
    want0 = combine(part(0, 1, 2).values(), CLASSES)
    assert c.initial_accuracy == want0.accuracy == 11 / 16
    # rounds 1 (no evaluation), 2 (evaluated: only edge 0 answers) and 3 (the last)
    e0.fake.submit(e0.next(evaluate=False), value=1.0)
    e1.fake.submit(e1.next(evaluate=False), value=1.0)
    ev2 = [e.next(evaluate=True) for e in (e0, e1)]
    assert all(t.version == 2 for t in ev2)
    assert e0.evaluated(ev2[0], part(0, 2)).accepted
    e0.fake.submit(e0.next(evaluate=False), value=2.0)
    last = [e.next(evaluate=True) for e in (e0, e1)]
    # the run waits for the final model's evaluation before it says DONE (clients stay)
    time.sleep(0.3)
    assert status(server.address).phase == pb.StatusReply.TRAINING
    assert e1.evaluated(last[1], part(1, 3)).accepted
    assert e0.evaluated(last[0], part(0, 2)).accepted
    assert server.join(30)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["evaluation"] == "federated"
    assert result["initial_accuracy"] == want0.accuracy
    assert result["initial_evaluation"]["evaluation_clients"] == 3
    recs = result["records"]
    assert [r["accuracy"] is not None for r in recs] == [False, True, True]
    two = combine(part(0, 2).values(), CLASSES)
    assert (recs[1]["accuracy"], recs[1]["evaluation_clients"],
            recs[1]["evaluation_samples"]) == (two.accuracy, 2, 14)
    assert recs[1]["loss"] == pytest.approx(two.loss)
    final = combine(HELD.values(), CLASSES)
    assert result["final_accuracy"] == final.accuracy == 11 / 19
    assert recs[2]["class_accuracy"] == [3 / 5, 2 / 3, 5 / 6, 1 / 5]
    assert recs[2]["evaluation_samples"] == 19 and recs[2]["loss"] == pytest.approx(
        sum(h.loss_sum for h in HELD.values()) / 19)


def test_a_silent_edge_holds_the_end_only_for_the_final_wait(cleanup, tmp_path: Path):
    server, (e0, e1) = federation(cleanup, tmp_path, rounds=1, wait_s=0.5)
    e0.fake.submit(e0.next(evaluate=False), value=1.0)
    assert e0.next(evaluate=True).round == 0  # the initial model's, never answered
    last = e0.next(evaluate=True)
    assert last.round == 1 and last.version == 1
    assert e0.evaluated(last, part(0)).accepted
    t0 = time.monotonic()
    assert server.join(30)  # edge 1 never answers: results after the bounded wait
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["records"][0]["evaluation_clients"] == 1
    assert result["final_accuracy"] == 3 / 5 and time.monotonic() - t0 < 20
    assert result["initial_accuracy"] is None  # nobody evaluated the initial model


def test_wrong_answers_are_refused_and_change_nothing(cleanup):
    server, (e0, e1) = federation(cleanup, None)
    t0, t1 = e0.next(evaluate=True), e1.next(evaluate=True)
    cases = [
        (lambda: e0.evaluated(t1, part(1)), grpc.StatusCode.INVALID_ARGUMENT, "not edge 0"),
        (lambda: e0.evaluated(t0, part(1)), grpc.StatusCode.INVALID_ARGUMENT, "client 1"),
        (lambda: e0.evaluated(t0, part(0), version=5), grpc.StatusCode.INVALID_ARGUMENT,
         "version"),
        (lambda: e0.evaluated(t0, part(0), task_id="eval-nope"), grpc.StatusCode.NOT_FOUND,
         "unknown"),
        (lambda: e0.evaluated(t0, {0: EvalSums(2, 1.0, 1, (1, 0), (1, 1))}),
         grpc.StatusCode.INVALID_ARGUMENT, "classes"),
    ]
    for call, code, needle in cases:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code and needle in err.value.details()
    assert server.service.controller.initial_accuracy is None
    # a right answer is then taken; one after the results are written is not
    assert e0.evaluated(t0, part(0)).accepted
    server.service.run.evaluations.close()
    assert not e1.evaluated(t1, part(1)).accepted
    assert server.service.controller.initial_accuracy == 3 / 5


def test_a_cloud_that_evaluates_centrally_refuses_evaluated(cleanup):
    server, (e0, _) = federation(cleanup, None, federated=False)
    task = e0.next(evaluate=False)
    with pytest.raises(grpc.RpcError) as err:
        e0.evaluated(task, part(0))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(queue.Empty):  # and it sends no evaluation task
        e0.next(evaluate=True, timeout=0.3)


def _task(task_id: str, m: int = 0):
    from fedcure_app.protocol.codec import WithModel
    from fedcure_app.strategy import Dispatch
    from cloud_server.state import TaskState

    d = Dispatch(round=0, coalition=m, version=0, clients=(0,), frequencies_ghz={},
                 t_hat_round_s=0.0, t_hat_s=0.0)
    return TaskState(task_id, d, WithModel(pb.Task(task_id=task_id), b""), time.monotonic())


def test_a_stream_sends_its_training_task_before_a_queued_evaluation_and_only_the_newest():
    async def run():
        edges = EdgeStreams(1)
        stream = await edges.open(0)
        done = asyncio.Event()
        old, new, train = _task("eval-old"), _task("eval-new"), _task("train")
        await edges.queue_evaluations([old])
        await edges.queue_evaluations([new])  # the unsent older one is dropped
        await edges.publish([train])
        got = [(await edges.next(stream, done)).task_id for _ in range(2)]
        assert got == ["train", "eval-new"] and old.expired is not None
        nxt = asyncio.ensure_future(edges.next(stream, done))
        await asyncio.sleep(0.05)
        assert not nxt.done()  # nothing left: neither task is sent twice
        done.set()
        await edges.wake_all()
        assert await nxt is None

    asyncio.run(run())


def test_the_live_view_and_metrics_show_the_federated_accuracy_when_it_lands(cleanup):
    from cloud_server.live import start_dashboard
    from tests.deployment.test_live_view import get, metrics, one

    server, (e0, e1) = federation(cleanup, None, rounds=6)
    live = start_dashboard(server.service.controller, "127.0.0.1", 0, interval_s=0.05)
    cleanup.append(live)
    for e in (e0, e1):
        e.next(evaluate=True)  # the initial model's: left unanswered
    e0.fake.submit(e0.next(evaluate=False), value=1.0)
    e1.fake.submit(e1.next(evaluate=False), value=1.0)
    ev2 = e0.next(evaluate=True)
    e0.fake.submit(e0.next(evaluate=False), value=1.0)  # round 3: the page holds 3 rounds
    state = json.loads(get(live.url + "api/state")[1])
    assert state["evaluation"] == "federated" and state["accuracy"] is None
    assert len(state["history"]) == 3
    assert e0.evaluated(ev2, part(0, 2)).accepted  # lands on round 2, not the newest
    state = json.loads(get(live.url + "api/state")[1])
    want = combine(part(0, 2).values(), CLASSES)
    assert (state["accuracy"], state["evaluation_clients"], state["evaluation_samples"]) == (
        want.accuracy, 2, 14)
    acc = state["round_fields"].index("accuracy")
    assert [r[acc] for r in state["history"]] == [None, want.accuracy, None]
    m = metrics(live.url)
    assert one(m, "fedcure_accuracy_ratio") == want.accuracy
    assert one(m, "fedcure_evaluation_federated") == 1
    assert (one(m, "fedcure_evaluation_clients"), one(m, "fedcure_evaluation_samples")) == (2, 14)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=8), st.integers(0, 8), st.lists(st.integers(0, 3),
                                                                          max_size=4))
def test_a_page_gets_the_rounds_again_from_the_first_that_changed(old, k, tail):
    from fedcure_app.live.server import first_change

    k = min(k, len(old))
    new = old[:k] + tail
    i = first_change(old, new)
    assert old[:i] == new[:i]  # the page keeps what did not change ...
    assert i == min(len(old), len(new)) or old[i] != new[i]  # ... and gets the first change


def test_with_per_edge_tokens_an_edge_answers_evaluations_only_as_itself(cleanup):
    from cloud_server.identity import EdgeCredentials

    tokens = {0: "edge0-0123456789abcdef", 1: "edge1-0123456789abcdef"}
    service = CloudService(make_cfg(2, 2, **{"num-classes": CLASSES}), expected_clients=2,
                           register_timeout_s=20, initial_arrays=SMALL_MODEL,
                           write_plots=False, federated_evaluation=True,
                           edge_credentials=EdgeCredentials(tokens))
    server = CloudServer(service, "127.0.0.1:0")
    server.start()
    cleanup.append(server)
    edges = [Edge(server.address, m, token=tokens[m]) for m in range(2)]
    cleanup.extend(e.fake for e in edges)
    register_all(server.address, [register_request(f"client-{i}", one_hot(i), home=i)
                                  for i in range(2)])
    t0 = edges[0].next(evaluate=True)
    with pytest.raises(grpc.RpcError) as err:  # edge 1's token acting as edge 0
        edges[1].evaluated(t0, {0: HELD[0]}, edge_id=0, token=tokens[1])
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert service.controller.initial_accuracy is None
    assert edges[0].evaluated(t0, {0: HELD[0]}, token=tokens[0]).accepted
    assert service.controller.initial_accuracy == 3 / 5
