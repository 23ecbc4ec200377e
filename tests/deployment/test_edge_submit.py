"""A finished task's Submit outlives a cloud that stops answering (a partition, a restart):
the edge asks again for ``reconnect_timeout_s`` counted from the first failure, and gives up
with one line past it, never dropping the result to serve on (edge_server/serve.py)."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from edge_server import serve
from edge_server.cli import main as edge_main
from edge_server.serve import EdgeRoleError, EdgeServer
from edge_server.settings import EdgeSettings
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.tasks import EdgeResult


class _Err(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"fake {self._code.name}"


class _Link:
    """A cloud link whose Submits fail as told (``hang_s``: the first call hangs that long, as
    a call on a partitioned connection does until the keepalive gives up), then answer."""

    def __init__(self, codes: list[grpc.StatusCode], hang_s: float = 0.0) -> None:
        self.codes = list(codes)
        self.hang_s = hang_s
        self.calls = 0

    def submit(self, wire, timeout):
        self.calls += 1
        if self.calls == 1 and self.hang_s:
            time.sleep(self.hang_s)
        if self.codes:
            raise _Err(self.codes.pop(0))
        return pb.SubmitReply(accepted=True, version=7, detail="aggregated as round 7")


@pytest.fixture
def edge(monkeypatch):
    monkeypatch.setattr(serve, "SUBMIT_RETRY_S", 0.01)
    # a channel that is never used: the link is replaced
    server = EdgeServer(grid=None, settings=EdgeSettings(
        cloud="127.0.0.1:9", edge_id=0, advertise="127.0.0.1:9", insecure=True,
        reconnect_timeout_s=0.2))
    yield server
    server.stop()


def _result() -> EdgeResult:
    return EdgeResult(task_id="r3-c0-v3", coalition=0, arrays=[np.zeros(2, np.float32)],
                      num_samples=10)


def test_a_submit_that_hangs_past_the_budget_is_still_asked_again_until_the_cloud_answers(edge):
    U, D = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED
    edge.link = _Link([U, U, D, U], hang_s=0.3)  # the hang alone outlasts the 0.2 s budget
    reply = edge._submit(_result(), 1.0)
    assert reply is not None and reply.accepted and reply.version == 7
    assert edge.link.calls == 5


def test_a_cloud_silent_for_longer_than_the_budget_ends_the_edge_naming_the_task(edge):
    edge.link = _Link([grpc.StatusCode.UNAVAILABLE] * 10_000)
    t0 = time.monotonic()
    with pytest.raises(EdgeRoleError, match=r"did not take task r3-c0-v3 for 0 s"):
        edge._submit(_result(), 1.0)
    assert 0.2 <= time.monotonic() - t0 < 5.0


def test_a_cloud_with_a_full_disk_is_asked_again_until_it_takes_the_update(edge):
    edge.link = _Link([grpc.StatusCode.RESOURCE_EXHAUSTED] * 3)
    reply = edge._submit(_result(), 1.0)
    assert reply is not None and reply.accepted and edge.link.calls == 4


def test_a_submit_the_cloud_cut_while_stopping_is_asked_again(edge):
    edge.link = _Link([grpc.StatusCode.CANCELLED] * 2)  # a stopping server cancels open calls
    reply = edge._submit(_result(), 1.0)
    assert reply is not None and reply.accepted and edge.link.calls == 3


def test_a_submit_that_fails_as_training_ends_is_let_go_without_an_error(monkeypatch, edge):
    import threading

    monkeypatch.setattr(serve, "SUBMIT_RETRY_S", 5.0)
    edge.settings = EdgeSettings(cloud="127.0.0.1:9", edge_id=0, advertise="127.0.0.1:9",
                                 insecure=True, reconnect_timeout_s=30.0)
    for code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL):
        edge._over.clear()
        edge.link = _Link([code] * 100)
        threading.Timer(0.2, edge._over.set).start()  # the stream's end comes after the failure
        t0 = time.monotonic()
        assert edge._submit(_result(), 1.0) is None
        assert time.monotonic() - t0 < 3.0 and edge.link.calls == 1


class _Stream:
    """A task stream that ends normally, or fails with ``code``."""

    def __init__(self, code: grpc.StatusCode | None = None) -> None:
        self.code = code

    def __iter__(self):
        if self.code is not None:
            raise _Err(self.code)
        return iter(())


class _Streams:
    def __init__(self, *streams: _Stream) -> None:
        self.streams = list(streams)

    def connect(self, request):
        return self.streams.pop(0)


def test_a_task_stream_the_cloud_cut_while_stopping_is_connected_again(edge):
    edge.link = _Streams(_Stream(grpc.StatusCode.CANCELLED), _Stream())
    stats = edge.run()
    assert stats.reconnects == 1 and edge.over and not edge.link.streams


def test_a_task_stream_refused_for_good_ends_the_edge_in_one_line(edge):
    edge.link = _Streams(_Stream(grpc.StatusCode.PERMISSION_DENIED))
    with pytest.raises(EdgeRoleError, match=r"refused the link \(PERMISSION_DENIED: fake"):
        edge.run()


def test_a_refusal_is_final_and_not_asked_again(edge):
    edge.link = _Link([grpc.StatusCode.FAILED_PRECONDITION])
    assert edge._submit(_result(), 1.0) is None
    assert edge.link.calls == 1
    edge.link = _Link([grpc.StatusCode.INTERNAL])
    with pytest.raises(grpc.RpcError):
        edge._submit(_result(), 1.0)


def test_a_coalition_model_the_cloud_refuses_is_logged_and_the_edge_takes_the_next_task(
        edge, caplog):
    edge.link = _Link([grpc.StatusCode.INVALID_ARGUMENT])  # the cloud's norm screen said no
    assert edge._submit(_result(), 1.0) is None
    assert edge.link.calls == 1
    assert any("did not take task r3-c0-v3 (INVALID_ARGUMENT" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("value", ["0", "-1", "inf"])
def test_fedcure_edge_refuses_a_reconnect_timeout_that_is_not_positive_seconds(value, capsys):
    code = edge_main(["--cloud", "127.0.0.1:9", "--edge-id", "0", "--listen",
                      "127.0.0.1:9092", "--insecure", "--reconnect-timeout", value])
    assert code == 2
    assert "--reconnect-timeout" in capsys.readouterr().err


# ------------------------------------------------------------------ clients that all fail
class _Directory:
    def __init__(self) -> None:
        self.refreshed = 0

    def resolve(self, clients, timeout_s, stop=None):
        return {c: 100 + c for c in clients}

    def refresh(self) -> None:
        self.refreshed += 1


class _Progress:
    def start_task(self, *a) -> None: ...
    def update(self, *a) -> None: ...
    def end_task(self) -> None: ...
    def close(self) -> None: ...


def _task():
    from fedcure_app.tasks import EdgeTask

    return EdgeTask(task_id="r3-c0-v3", coalition=0, version=3,
                    arrays=[np.zeros(2, np.float32)], clients=(0, 1),
                    frequencies_ghz={0: 1.0, 1: 1.0}, tau_e=2, tau_c=1, lr=0.1,
                    batch_size=8, seed=0)


def _failing_edge(monkeypatch, edge, failures: int):
    from fedcure_app.flower.edge import EdgeTaskError

    monkeypatch.setattr(serve, "TASK_RETRY_S", 0.01)
    monkeypatch.setattr(serve, "task_from_proto", lambda wire: wire)
    calls: list[int] = []

    def run_edge_task(grid, task, mapping, **kw):
        calls.append(1)
        if len(calls) <= failures:
            raise EdgeTaskError("task r3-c0-v3 (coalition 0): no client answered edge round 0")
        return _result()

    monkeypatch.setattr(serve, "run_edge_task", run_edge_task)
    edge.directory, edge.progress = _Directory(), _Progress()
    submitted: list = []
    edge._submit = lambda result, latency: submitted.append(result) or None
    return calls, submitted


def test_an_edge_whose_clients_all_fail_runs_the_task_again_until_they_answer(monkeypatch, edge):
    edge.settings = EdgeSettings(cloud="127.0.0.1:9", edge_id=0, advertise="127.0.0.1:9",
                                 insecure=True, reconnect_timeout_s=30.0)
    calls, submitted = _failing_edge(monkeypatch, edge, failures=5)
    edge._serve_task(_task())
    assert len(calls) == 6 and len(submitted) == 1  # answered (late) once they came back
    assert edge.directory.refreshed == 5


def test_an_edge_gives_up_a_task_only_after_its_reconnect_budget(monkeypatch, edge):
    calls, submitted = _failing_edge(monkeypatch, edge, failures=10_000)  # budget 0.2 s
    t0 = time.monotonic()
    with pytest.raises(EdgeRoleError, match=r"no client answered edge round 0 \(for 0 s\)"):
        edge._serve_task(_task())
    assert 0.2 <= time.monotonic() - t0 < 5.0 and len(calls) > 2 and not submitted
