"""Federated evaluation: clients' held-out sums -> edge (fake grid) -> cloud, exact.

The clients answer evaluate messages through the real ClientApp handler (their node data files
hold a held-out part); the edge loop is :func:`run_edge_evaluation` on a fake grid; the sums are
combined by the cloud's :func:`cloud_server.fedeval.combine`. The federated accuracy equals a
central evaluation of the same model on the union of the held-out parts.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_server.fedeval import combine
from fedcure_app.flower.eval_metrics import SUM_KEYS
from fedcure_app.tasks import EdgeTask, EvalSums
from tests.simulation.fake_grid import FakeGrid, task_identity

CLASSES = ["a", "b", "c"]
FEATURES = 5


@pytest.fixture(autouse=True)
def _identity():
    with task_identity():
        yield


def _task() -> dict:
    from fedcure_app.data.task import TaskConfig

    return TaskConfig(kind="tabular", classes=CLASSES, features=FEATURES,
                      model="mlp").model_dump(mode="json", by_alias=True)


def _node_file(tmp_path: Path, name: str, seed: int, n_test: int | None) -> Path:
    """A tabular own-data client: 20 training rows and ``n_test`` held-out rows (None: no
    held-out part), its classes skewed by ``seed``."""
    from fedcure_app.devices import PRESETS
    from fedcure_app.flower.node_data import NodeData, save_node_data

    rng = np.random.default_rng(seed)
    held = None if n_test is None else (
        rng.normal(size=(n_test, FEATURES)).astype(np.float32),
        rng.integers(0, 2 + seed % 2, n_test).astype(np.int64))
    data = NodeData(x=rng.normal(size=(20, FEATURES)).astype(np.float32),
                    y=rng.integers(0, 3, 20).astype(np.int64), dataset="own",
                    num_classes=len(CLASSES), client_name=name, partition_id=seed,
                    profile=PRESETS["laptop"], x_test=None if held is None else held[0],
                    y_test=None if held is None else held[1], task=_task())
    return save_node_data(tmp_path / f"{name}.npz", data)


def _model_arrays(seed: int = 1) -> list[np.ndarray]:
    import torch

    from fedcure_app.data.task import parse_task
    from fedcure_app.models import build_model, get_weights

    torch.manual_seed(seed)
    return get_weights(build_model(parse_task(_task()), len(CLASSES)))


def _client_handler(path: Path, client: int):
    """A node answering through the real ClientApp ``evaluate`` handler."""
    from flwr.app import Context, RecordDict

    import fedcure_app.flower.client_app as client_app

    def handle(msg):
        client_app._deployed.clear()
        ctx = Context(run_id=1, node_id=client, node_config={"data-file": str(path),
                                                             "client-id": client},
                      state=RecordDict(), run_config={})
        reply = client_app.evaluate_local(msg, ctx)
        client_app._deployed.clear()
        return reply

    return handle


def _central(paths: list[Path], arrays: list[np.ndarray]):
    """The central evaluation of ``arrays`` on the union of the clients' held-out parts."""
    from fedcure_app.data.task import parse_task
    from fedcure_app.flower.node_data import load_node_data
    from fedcure_app.models import build_model, set_weights
    from fedcure_app.training import evaluate

    parts = [load_node_data(p) for p in paths]
    x = np.concatenate([d.x_test for d in parts if d.x_test is not None])
    y = np.concatenate([d.y_test for d in parts if d.y_test is not None])
    model = build_model(parse_task(_task()), len(CLASSES))
    set_weights(model, arrays)
    return evaluate(model, x, y), y


def _edge_task(arrays, clients) -> EdgeTask:
    return EdgeTask(task_id="eval-r5-c0-v9", coalition=0, version=9, arrays=arrays,
                    clients=tuple(clients), frequencies_ghz={}, tau_e=1, tau_c=1, lr=0.0,
                    batch_size=8, seed=0, evaluate=True)


def test_the_federated_accuracy_is_a_central_evaluation_on_the_union_of_held_out_parts(
        tmp_path: Path):
    from fedcure_app.flower.edge_eval import run_edge_evaluation

    paths = [_node_file(tmp_path, f"c{i}", i, n) for i, n in enumerate((7, 13, 4))]
    nodes = {c: 100 + c for c in range(3)}
    grid = FakeGrid({100 + c: _client_handler(p, c) for c, p in enumerate(paths)})
    arrays = _model_arrays()
    out = run_edge_evaluation(grid, _edge_task(arrays, range(3)), nodes, poll_s=0.001,
                              timeout_s=5.0, num_classes=len(CLASSES))
    assert out.missing == [] and sorted(out.clients) == [0, 1, 2]
    assert [m.metadata.message_type for m in grid.sent] == ["evaluate"] * 3
    fed = combine(out.clients.values(), len(CLASSES))
    central, y = _central(paths, arrays)
    assert (fed.samples, fed.clients) == (24, 3)
    assert fed.accuracy == central.accuracy  # exact: the same counts
    assert fed.loss == pytest.approx(central.loss, rel=1e-6)  # batches differ: float rounding
    for k, acc in enumerate(fed.class_accuracy):
        want = central.class_accuracy[k]
        assert (acc is None and np.isnan(want)) or acc == want
    assert sum(out.clients[c].samples for c in out.clients) == y.size


def test_every_client_answers_the_same_metric_keys_with_or_without_a_held_out_part(
        tmp_path: Path):
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from fedcure_app.flower.packing import pack

    paths = [_node_file(tmp_path, "held", 0, 6), _node_file(tmp_path, "none", 1, None)]
    keys = []
    for c, path in enumerate(paths):
        msg = Message(RecordDict({"arrays": ArrayRecord(pack(_model_arrays())),
                                  "config": ConfigRecord({"client-id": c})}),
                      dst_node_id=1, message_type="evaluate")
        reply = _client_handler(path, c)(msg)
        metrics = reply.content["metrics"]
        keys.append(sorted(metrics.keys()))
        assert len(metrics["eval-class-total"]) == len(CLASSES)
        if c == 1:  # no held-out part: the old evaluation on its training data, zero sums
            assert metrics["eval-samples"] == 0 and metrics["num-examples"] == 20
        else:
            assert metrics["eval-samples"] == metrics["num-examples"] == 6
    assert keys[0] == keys[1] and set(SUM_KEYS) <= set(keys[0])


def test_the_edge_lists_silent_and_malformed_clients_as_missing(tmp_path: Path):
    from flwr.app import MetricRecord, RecordDict

    from fedcure_app.flower.edge_eval import run_edge_evaluation

    path = _node_file(tmp_path, "ok", 0, 5)
    grid = FakeGrid({100: _client_handler(path, 0), 101: lambda m: None,
                     102: lambda m: RecordDict({"metrics": MetricRecord({"eval-samples": 3})}),
                     103: lambda m: RecordDict({"metrics": MetricRecord({
                         "eval-samples": 1, "eval-loss-sum": 0.5, "eval-correct": 1,
                         "eval-class-correct": [1, 0], "eval-class-total": [1, 0]})})})
    task = _edge_task(_model_arrays(), (0, 1, 2, 3, 4))
    out = run_edge_evaluation(grid, task, {0: 100, 1: 101, 2: 102, 3: 103}, poll_s=0.001,
                              timeout_s=0.05, num_classes=len(CLASSES))
    assert sorted(out.clients) == [0] and out.missing == [1, 2, 3, 4]
    assert "no reply" in out.problems[1] and "lack" in out.problems[2]
    assert "2 classes" in out.problems[3] and "no Flower node" in out.problems[4]


def _sums(draw_counts: list[tuple[int, int, int]]) -> list[EvalSums]:
    """Clients' sums from (class, correct?, count) triples per client."""
    out = []
    for i, (a, b, c) in enumerate(draw_counts):
        total = (a, b, c)
        correct = (a // 2, b, 0)
        out.append(EvalSums(sum(total), 0.25 * sum(total) + i, sum(correct), correct, total))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)),
                min_size=1, max_size=6))
def test_combine_is_the_sample_weighted_mean_and_ignores_clients_without_samples(counts):
    sums = _sums(counts)
    res = combine(sums, 3)
    n = sum(s.samples for s in sums)
    assert res.samples == n and res.clients == sum(1 for s in sums if s.samples)
    if n == 0:
        assert res.accuracy is None and res.loss is None
        return
    weighted = sum(s.samples * (s.correct / s.samples) for s in sums if s.samples) / n
    assert res.accuracy == pytest.approx(weighted)
    assert res.loss == pytest.approx(sum(s.loss_sum for s in sums) / n)
    for k in range(3):
        t = sum(s.class_total[k] for s in sums)
        c = sum(s.class_correct[k] for s in sums)
        assert res.class_accuracy[k] == (None if t == 0 else c / t)
    # the order the edges answered in does not change the result
    assert combine(list(reversed(sums)), 3) == res


def test_inconsistent_sums_are_refused():
    with pytest.raises(ValueError):
        EvalSums(3, 1.0, 4, (4,), (3,))  # more correct than samples
    with pytest.raises(ValueError):
        EvalSums(3, 1.0, 1, (1, 0), (2, 0))  # per-class totals do not sum to the samples
    with pytest.raises(ValueError):
        combine([EvalSums(2, 1.0, 1, (1, 0), (1, 1))], 3)


# ------------------------------------------------------------------------------ a whole run
def test_a_run_evaluated_on_the_clients_held_out_parts_matches_a_central_evaluation(
        cleanup, tmp_path: Path):
    """The real cloud (a task, no test set), 2 real EdgeServers on fake grids and 4 clients
    answering through the real ClientApp: every evaluation is federated, and the initial and
    final accuracies equal a central evaluation of those models on the union of the clients'
    held-out parts."""
    import json
    import threading

    import torch
    from flwr.app import Context, RecordDict

    import fedcure_app.flower.client_app as client_app
    from edge_server.serve import EdgeServer
    from edge_server.settings import EdgeSettings
    from fedcure_app.config import FedCureConfig, apply_flat, build_config
    from fedcure_app.data.task import parse_task
    from fedcure_app.flower.node_data import load_node_data
    from fedcure_app.models import build_model, get_weights, model_signature
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.codec import profile_to_proto
    from tests.deployment.fakes import channel, start_cloud

    base = apply_flat(FedCureConfig(), {
        "num-clients": 4, "num-edges": 2, "global-rounds": 2, "eval-every": 1, "tau-e": 1,
        "tau-c": 2, "batch-size": 8, "max-concurrent": 2, "formation": "none"})
    data = base.model_dump()
    data["task"], data["federation"]["num_classes"] = _task(), len(CLASSES)
    cfg = build_config(data)
    torch.manual_seed(0)
    initial = get_weights(build_model(cfg.task))
    server = start_cloud(cfg, expected=4, initial=initial, out_dir=tmp_path / "out")
    cleanup.append(server)
    assert server.service.controller.federated_evaluation
    grids = {0: FakeGrid({}), 1: FakeGrid({})}
    edges = [EdgeServer(grids[m], EdgeSettings(cloud=server.address, edge_id=m,
                                               advertise=f"edge{m}:1", insecure=True,
                                               discovery_timeout_s=60)) for m in (0, 1)]
    threads = [threading.Thread(target=e.run, daemon=True) for e in edges]
    for t in threads:
        t.start()
    paths = [_node_file(tmp_path, f"dev-{i}", i, (5, 9, 6, 3)[i]) for i in range(4)]
    stub = pb_grpc.AssociationStub(channel(server.address))
    signature = json.dumps([[k, list(s)] for k, s in model_signature(build_model(cfg.task))])

    def client(i: int) -> None:
        node = load_node_data(paths[i])
        reply = stub.Register(pb.RegisterRequest(
            client_name=f"dev-{i}", label_counts=node.label_counts.tolist(),
            num_samples=int(node.y.size), device=profile_to_proto(node.profile),
            home_edge=i % 2, model_signature=signature), timeout=60)
        ctx = Context(run_id=1, node_id=100 + i, state=RecordDict(), run_config={},
                      node_config={"client-id": reply.client_id, "cpufreq": "off",
                                   "data-file": str(paths[i])})
        grids[reply.edge_id].handlers[1000 + i] = lambda m: client_app.app(m, ctx)

    regs = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in regs:
        t.start()
    for t in regs:
        t.join(60)
    assert server.join(120), "the run did not finish"
    for t in threads:
        t.join(10)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["evaluation"] == "federated" and result["rounds"] == 2
    assert all(r["evaluation_clients"] == 4 and r["evaluation_samples"] == 23
               for r in result["records"])
    final = server.service.controller.strategy.global_arrays
    for arrays, acc, loss in ((initial, result["initial_accuracy"],
                               result["initial_evaluation"]["loss"]),
                              (final, result["final_accuracy"],
                               result["records"][-1]["loss"])):
        central, _ = _central(paths, arrays)
        assert acc == central.accuracy
        assert loss == pytest.approx(central.loss, rel=1e-6)
    assert parse_task(_task()).num_classes == len(result["records"][-1]["class_accuracy"])


class _Failure(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"{self._code.name} for the test"


def test_the_edge_asks_a_silent_cloud_again_within_its_budget_and_drops_a_refused_answer():
    from edge_server.evaluation import send_evaluated
    from fedcure_app.protocol import cloud_pb2 as pb

    req = pb.EvaluatedRequest(task_id="eval-r0-c0-v0", edge_id=0)
    now = [0.0]
    calls = []

    def flaky(request, timeout):
        calls.append(request)
        if len(calls) < 3:
            raise _Failure(grpc.StatusCode.UNAVAILABLE)
        return pb.EvaluatedReply(accepted=True)

    def tick(s):
        now[0] += s

    assert send_evaluated(flaky, req, sleep=tick, clock=lambda: now[0]).accepted
    assert len(calls) == 3

    def refused(request, timeout):
        calls.append(request)
        raise _Failure(grpc.StatusCode.INVALID_ARGUMENT)

    calls.clear()
    assert send_evaluated(refused, req, sleep=tick, clock=lambda: now[0]) is None
    assert len(calls) == 1  # a refusal is final

    def silent(request, timeout):
        calls.append(request)
        raise _Failure(grpc.StatusCode.UNAVAILABLE)

    calls.clear()
    assert send_evaluated(silent, req, budget_s=5.0, sleep=tick, clock=lambda: now[0]) is None
    assert 5 <= len(calls) <= 8  # about one ask a second, then the evaluation is given up
