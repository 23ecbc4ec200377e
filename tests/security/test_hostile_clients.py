"""What one hostile (or broken) client can do to its edge, its coalition and the cloud, and
what it cannot (docs/security.md, "What a client can do")."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedcure_app.flower.edge import run_edge_task
from fedcure_app.tasks import EdgeTask
from tests.simulation.fake_grid import FakeGrid, task_identity

SHAPES = [(3, 2), (4,)]
NODE = {0: 100, 1: 101, 2: 102}


@pytest.fixture(autouse=True)
def _identity():
    with task_identity():
        yield


def _task(**over) -> EdgeTask:
    base = dict(task_id="r1-c0-v0", coalition=0, version=0,
                arrays=[np.zeros(s, np.float32) for s in SHAPES], clients=(0, 1, 2),
                frequencies_ghz={}, tau_e=2, tau_c=3, lr=0.05, batch_size=8, seed=1)
    base.update(over)
    return EdgeTask(**base)


def _client(step: float, *, count: float = 10, loss: float = 1.0, shift: float = 0.0):
    """A fake client: adds ``step`` (+ ``shift``) to every weight and reports ``count``
    examples and ``loss``."""

    def handle(msg: Message) -> RecordDict:
        arrays = [a + step + shift for a in msg.content["arrays"].to_numpy_ndarrays()]
        return RecordDict({
            "arrays": ArrayRecord(arrays),
            "metrics": MetricRecord({"num-examples": count, "samples": 24, "seconds": 0.5,
                                     "f-applied-ghz": 1.0, "loss": loss}),
        })

    return handle


def _value(result) -> float:
    v = {float(x) for a in result.arrays for x in np.ravel(a)}
    assert len(v) == 1
    return v.pop()


@pytest.mark.parametrize("bad", [dict(loss=math.nan), dict(loss=math.inf),
                                 dict(step=math.nan), dict(shift=1e6)],
                         ids=["nan-loss", "inf-loss", "nan-model", "shifted-model"])
def test_a_member_with_a_non_finite_or_shifted_update_is_dropped_and_the_edge_goes_on(
        bad, caplog):
    handlers = {NODE[0]: _client(0.01), NODE[1]: _client(0.03),
                NODE[2]: _client(bad.pop("step", 0.02), **bad)}
    task = _task(client_step_bound=0.05 * 3 * 100.0)
    result = run_edge_task(FakeGrid(handlers), task, NODE, poll_s=0.001)
    assert result.dropped == [2]  # counted once, though the task has two edge rounds
    assert _value(result) == pytest.approx(2 * 0.02, rel=1e-6)  # the others' mean, twice
    assert all(r.client != 2 and math.isfinite(r.loss) for r in result.reports)
    assert sum("client 2 dropped" in r.getMessage() for r in caplog.records) == 1


def test_fedavg_weights_come_from_the_registered_counts_not_the_replies():
    # client 2 registered 10 samples but says 10⁹ in every reply
    handlers = {NODE[0]: _client(1.0, count=10), NODE[1]: _client(2.0, count=10),
                NODE[2]: _client(4.0, count=1e9)}
    task = _task(tau_e=1, client_samples={0: 10, 1: 10, 2: 10})
    result = run_edge_task(FakeGrid(handlers), task, NODE, poll_s=0.001)
    assert _value(result) == pytest.approx((1 + 2 + 4) / 3, rel=1e-6)
    assert result.num_samples == 30


def test_a_client_that_registered_a_huge_count_takes_at_most_the_cap():
    handlers = {NODE[0]: _client(1.0), NODE[1]: _client(3.0), NODE[2]: _client(8.0)}
    task = _task(tau_e=1, client_samples={0: 100, 1: 300, 2: 10**9}, max_client_weight=0.5)
    result = run_edge_task(FakeGrid(handlers), task, NODE, poll_s=0.001)
    # weights 0.125, 0.375, 0.5: the honest two keep their 1:3 ratio
    assert _value(result) == pytest.approx(0.125 * 1 + 0.375 * 3 + 0.5 * 8, rel=1e-6)
    assert result.num_samples == 800  # the counts the capped weights stand for
