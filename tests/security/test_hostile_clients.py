"""What one hostile (or broken) client can do to its edge, its coalition and the cloud, and
what it cannot (docs/security.md, "What a client can do")."""

from __future__ import annotations

import json
import os
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedcure_app.flower.edge import run_edge_task
from fedcure_app.tasks import EdgeTask
from tests.deployment.conftest import cleanup  # noqa: F401 - the live clouds' fixture
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


def test_a_coalition_whose_every_answer_is_refused_is_told_apart_from_one_that_is_gone():
    from flwr.app import Error

    from fedcure_app.flower.edge import EdgeTaskError

    hostile = {NODE[0]: _client(0.01, loss=math.nan), NODE[1]: _client(0.0, shift=1e6),
               NODE[2]: _client(math.nan)}
    with pytest.raises(EdgeTaskError) as info:
        run_edge_task(FakeGrid(hostile), _task(client_step_bound=15.0), NODE, poll_s=0.001)
    assert info.value.refused  # the same task would bring the same answers
    for gone in (lambda m: None, lambda m: Error(code=1, reason="node unavailable")):
        with pytest.raises(EdgeTaskError) as info:
            run_edge_task(FakeGrid({**hostile, NODE[2]: gone}), _task(client_step_bound=15.0),
                          NODE, poll_s=0.001, timeout_s=0.05)
        assert not info.value.refused  # one may come back: the edge looks for it again


def test_an_edge_whose_whole_coalition_is_refused_logs_it_and_takes_the_next_task(
        monkeypatch, caplog):
    from edge_server import serve
    from edge_server.serve import EdgeServer
    from edge_server.settings import EdgeSettings
    from fedcure_app.flower.edge import EdgeTaskError
    from tests.deployment.test_edge_submit import _Directory, _Progress, _result

    edge = EdgeServer(grid=None, settings=EdgeSettings(
        cloud="127.0.0.1:9", edge_id=0, advertise="127.0.0.1:9", insecure=True,
        reconnect_timeout_s=300.0))
    answers = [EdgeTaskError("no client answered edge round 0 (client 2: loss must be finite)",
                             refused=True), _result()]
    runs: list[str] = []

    def run_edge_task(grid, task, mapping, **kw):
        runs.append(task.task_id)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(serve, "task_from_proto", lambda wire: wire)
    monkeypatch.setattr(serve, "run_edge_task", run_edge_task)
    edge.directory, edge.progress = _Directory(), _Progress()
    submitted: list = []
    edge._submit = lambda result, latency: submitted.append(result.task_id) or None
    try:
        edge._serve_task(_task(task_id="r1-c0-v0"))  # returns at once: no 300 s of retries
        edge._serve_task(_task(task_id="r2-c0-v1"))
    finally:
        edge.stop()
    assert runs == ["r1-c0-v0", "r2-c0-v1"] and edge.directory.refreshed == 0
    assert submitted == ["r3-c0-v3"]  # the next task's answer (the fake result's id)
    assert sum("task given up" in r.getMessage() for r in caplog.records) == 1


class _Role:
    """A launched role whose process exits with ``code`` after ``polls`` polls."""

    def __init__(self, name: str, code: int | None, polls: int = 0) -> None:
        from types import SimpleNamespace

        self.name, self._code, self._polls = name, code, polls
        self.proc = SimpleNamespace(returncode=None)

    def poll(self) -> int | None:
        self._polls -= 1
        if self._polls < 0:
            self.proc.returncode = self._code
        return self.proc.returncode

    def tail(self, n: int = 20) -> str:
        return "fedcure-edge: error: edge 1: no client answered (for 300 s)"


def _supervise(cloud: _Role, edges: list[_Role]) -> tuple[int, str]:
    import argparse
    from types import SimpleNamespace

    from fedcure_app.cli.launch_wait import supervise

    roles = SimpleNamespace(cloud=cloud, edges=edges, clients=[])
    args = argparse.Namespace(no_progress=True, timeout=30.0)
    stop = SimpleNamespace(is_set=lambda: False, wait=lambda _s: False)  # polls without pause
    return supervise(roles, lambda: None, 4, args, stop, exit_grace_s=0.0)


def test_a_launch_goes_on_without_one_failed_edge_and_fails_when_every_edge_has(caplog):
    code, reason = _supervise(_Role("cloud", 0, polls=5),
                              [_Role("edge0", None), _Role("edge1", 1, polls=1)])
    assert code == 0 and reason.startswith("done (edge1 exited with code 1: edge 1: no client")
    lines = [r.getMessage() for r in caplog.records if "edge1 exited" in r.getMessage()]
    assert len(lines) == 1 and "the others train on" in lines[0]
    code, reason = _supervise(_Role("cloud", None),
                              [_Role("edge0", 1, polls=3), _Role("edge1", 1, polls=1)])
    assert code == 1 and reason.count("exited with code 1") == 2


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


# ------------------------------------------------------------------ counts at registration
def test_a_registered_count_other_than_the_histograms_sum_is_refused_and_changes_nothing(
        cleanup):
    import grpc

    from tests.deployment.reliability import one_hot, request, start
    from tests.deployment.fakes import make_cfg
    from tests.deployment.test_hostile import association, everything, refused

    server = start(make_cfg(2, 1), expected=2)
    cleanup.append(server)
    stub = association(cleanup, server)
    for claimed in (10**9, 21, 19):  # the liar's 10⁹, and one off either way
        req = request("liar", one_hot(0))  # 20 samples of class 0
        req.num_samples = claimed
        detail = refused(lambda r=req: stub.Register(r, timeout=5),
                         grpc.StatusCode.INVALID_ARGUMENT)
        assert f"num_samples {claimed} is not the label histogram's sum 20" in detail
    assert everything(server, None) == {"phase": 1, "clients": [], "checkpoint": None,
                                        "faults": 0}


def test_the_task_carries_the_registered_counts_the_cap_and_the_clients_step_bound(cleanup):
    from tests.deployment.fakes import FakeEdge, make_cfg
    from tests.deployment.reliability import register_all, request, start

    server = start(make_cfg(2, 1, **{"max-client-weight": 0.7}), expected=2)
    cleanup.append(server)
    edge = FakeEdge(server.address, 0)
    cleanup.append(edge)
    reqs = [request("a", [20, 0, 0, 0], home=0), request("b", [0, 30, 10, 0], home=0)]
    reqs[1].num_samples = 40
    register_all(server.address, reqs)
    task = edge.next_task()
    assert dict(task.client_samples) == {0: 20, 1: 40}
    assert task.max_client_weight == pytest.approx(0.7)
    cfg = server.service.controller.cfg
    assert task.client_step_bound == pytest.approx(
        cfg.method.lr * cfg.method.tau_c * cfg.reliability.norm_grad_bound)


@pytest.mark.parametrize("epsilon,min_count", [(0.0, 0), (0.0, 5), (0.5, 0), (0.05, 3)])
def test_an_honest_private_histogram_always_passes_the_count_check(epsilon, min_count):
    from cloud_server.validation import check_sample_count
    from fedcure_app.core.privacy import private_histogram

    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = rng.integers(0, 40, size=10)
        if counts.sum() == 0:
            continue
        released = private_histogram(counts, epsilon if epsilon > 0 else math.inf, min_count,
                                     rng=rng)
        check_sample_count(int(counts.sum()), released.tolist(), epsilon, min_count)


def test_exact_counts_must_sum_to_the_registered_count_and_noise_widens_it_boundedly():
    from cloud_server.validation import Refused, check_sample_count, sample_count_slack

    check_sample_count(0, [3, 4], 0.0, 0)  # 0: the sum is the count
    check_sample_count(7, [3, 4], 0.0, 0)
    for bad in (6, 8, 10**12):
        with pytest.raises(Refused):
            check_sample_count(bad, [3, 4], 0.0, 0)
    below, above = sample_count_slack(10, 1.0, 0)
    assert below == above and 300 < below < 400  # 10·(0.5 + ln 10 + 30) at ε = 1
    assert sample_count_slack(10, 0.0, 5) == (0.0, 40.0)  # four samples in each of 10 classes
    with pytest.raises(Refused):
        check_sample_count(10**9, [3, 4], 1.0, 0)


# ------------------------------------------------------------------ code needs consent
def test_consent_allows_built_ins_and_the_owners_paths_only():
    from fedcure_app.data.model_consent import ModelNotAllowed, check_consent, parse_allowed
    from fedcure_app.errors import UsageError

    allowed = parse_allowed(["pkg.models:small, other:f", "third:g"])
    assert allowed == {"pkg.models:small", "other:f", "third:g"}
    for model in ("cnn", "mlp", "digits", "pkg.models:small", "third:g"):
        check_consent(model, allowed)
    for model in ("cleanup:factory", "builtins:print", "pkg.models:other"):
        with pytest.raises(ModelNotAllowed, match=f"--allow-model {model}") as err:
            check_consent(model, allowed)
        assert "\n" not in str(err.value) and err.value.code == "model-refused"
    with pytest.raises(UsageError, match="not an import path"):
        parse_allowed(["os.system"])


def _claim_reply(model: str):
    from types import SimpleNamespace

    return SimpleNamespace(config_json=json.dumps(config_with_task(model)), num_partitions=2)


def test_a_cloud_task_naming_an_import_path_needs_the_clients_consent(tmp_path):
    import argparse

    from client.association import config_of
    from fedcure_app.data.model_consent import ModelNotAllowed

    args = argparse.Namespace(data=str(tmp_path), dataset=None, allow_model=None, task=None)
    assert config_of(_claim_reply("mlp"), args).task.model == "mlp"  # built in: no consent
    with pytest.raises(ModelNotAllowed):
        config_of(_claim_reply("builtins:print"), args)
    args.allow_model = ["examples.custom_model:factory"]
    assert config_of(_claim_reply("examples.custom_model:factory"), args).task is not None
    with pytest.raises(ModelNotAllowed):  # consent is for the exact path
        config_of(_claim_reply("examples.custom_model:other"), args)
    own = tmp_path / "mine.toml"
    own.write_text('[task]\nclasses = ["x", "y"]\nkind = "tabular"\nfeatures = 3\n'
                   'model = "my_pkg.nets:tiny"\n')
    args.allow_model, args.task = None, str(own)  # the client's own task file names it
    assert config_of(_claim_reply("my_pkg.nets:tiny"), args).task.model == "my_pkg.nets:tiny"


def test_a_cloud_task_cannot_import_a_module_from_the_clients_working_folder(tmp_path,
                                                                              monkeypatch):
    """The reproduction: ``cleanup.py`` beside the client, a task naming ``cleanup:factory``
    (allowed by its owner, even): the client's data child never imports it from there."""
    from client.own_data import read_own_data
    from fedcure_app.config import build_config
    from fedcure_app.flower.own_node import DataRefused

    folder = tmp_path / "client-folder"
    folder.mkdir()
    (folder / "cleanup.py").write_text(
        "from pathlib import Path\nPath('ran.txt').write_text('the cloud ran me')\n"
        "def factory(shape, n):\n    raise SystemExit(0)\n")
    (folder / "data.csv").write_text("a,b,c,label\n" + "".join(
        f"{i},{i % 3},{i % 5},{'xy'[i % 2]}\n" for i in range(20)))
    cfg = config_with_task("cleanup:factory")
    monkeypatch.chdir(folder)
    with pytest.raises(DataRefused, match="cannot import cleanup"):
        read_own_data(build_config(cfg), 0, "c0", tmp_path / "node.npz",
                      data=str(folder / "data.csv"), label_column=None, holdout=None,
                      epsilon=0.0, min_count=0, timeout_s=120)
    assert not (folder / "ran.txt").exists()


def config_with_task(model: str) -> dict:
    """A run's configuration (JSON) whose task names ``model``."""
    from fedcure_app.config import FedCureConfig

    cfg = FedCureConfig().model_dump(mode="json", by_alias=True)
    cfg["federation"]["num-classes"] = 2
    cfg["task"] = {"classes": ["x", "y"], "kind": "tabular", "features": 3, "model": model}
    return cfg


def test_a_cloud_task_naming_another_import_path_is_refused_at_claim_on_both_sides(
        tmp_path, capsys, caplog):
    import logging

    from client.cli import main as client_main
    from fedcure_app.config import build_config
    from tests.deployment.fakes import start_cloud

    cfg = config_with_task("builtins:print")  # would print on every client
    cfg["federation"].update({"num-clients": 2, "num-edges": 1})
    server = start_cloud(build_config(cfg), expected=2, timeout=30.0,
                         initial=[np.zeros((2, 3), np.float32)])
    try:
        (tmp_path / "data.csv").write_text("a,b,c,label\n1,2,3,x\n4,5,6,y\n")
        with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
            code = client_main(["--cloud", server.address, "--insecure", "--name", "c0",
                                "--data", str(tmp_path / "data.csv"), "--runtime", "flower",
                                "--work-dir", str(tmp_path / "work"), "--connect-timeout",
                                "10"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err
        assert "'builtins:print'" in err and "--allow-model builtins:print" in err
        assert [r.getMessage() for r in caplog.records if "withdrew" in r.getMessage()] == [
            "client 'c0' withdrew: model-refused (formation waits for 1 clients now)"]
    finally:
        server.stop()


def test_a_launch_allows_its_own_tasks_model_to_its_own_clients_explicitly(tmp_path,
                                                                         monkeypatch):
    from fedcure_app.data.model_consent import own_clients_consent
    from fedcure_app.data.task import parse_task

    monkeypatch.chdir(tmp_path)
    base = {"classes": ["x", "y"], "kind": "tabular", "features": 3}
    assert own_clients_consent(parse_task({**base, "model": "mlp"}), {"A": "1"}) == (
        [], {"A": "1"})
    argv, env = own_clients_consent(parse_task({**base, "model": "mine:f"}),
                                    {"PYTHONPATH": "/opt/x"})
    assert argv == ["--allow-model", "mine:f"]
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/opt/x"]


# ------------------------------------------------------------------ launch's client cap
def test_the_launch_cap_is_what_memory_holds_unless_max_clients_raises_it():
    from fedcure_app.runtime.launch_memory import CLIENT_BYTES, clients_refusal, memory_cap

    gib = 2**30
    assert memory_cap(16 * gib) == 16 * gib // CLIENT_BYTES == 23
    assert clients_refusal(23, 16 * gib, None) is None
    why = clients_refusal(300, 16 * gib, None)
    assert why is not None and "\n" not in why
    assert "300 entries: about 205.1 GiB" in why and "16.0 GiB available" in why
    assert "--max-clients 300" in why
    assert clients_refusal(300, 16 * gib, 300) is None  # the user raised the cap
    assert "more than --max-clients 200" in clients_refusal(300, 16 * gib, 200)


def test_fedcure_launch_refuses_more_entries_than_memory_holds_in_one_line(
        tmp_path, monkeypatch, capsys):
    from fedcure_app.cli import main
    from fedcure_app.data.task import parse_task, task_toml
    from fedcure_app.runtime import launch_memory

    clients = tmp_path / "clients"
    clients.mkdir()
    for i in range(5):
        (clients / f"site-{i}.csv").write_text(
            "a,b,label\n" + "".join(f"{j},{j % 3},{'lo' if j % 2 else 'hi'}\n"
                                    for j in range(8)))
    task = parse_task({"classes": ["lo", "hi"], "kind": "tabular", "features": 2})
    (tmp_path / "task.toml").write_text(task_toml(task))
    monkeypatch.setattr(launch_memory, "available_bytes", lambda: 3 * launch_memory.CLIENT_BYTES)
    argv = ["launch", "--task", str(tmp_path / "task.toml"), "--clients-data", str(clients),
            "--edges", "1", "--out", str(tmp_path / "out"), "--no-dashboard", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "5 entries" in err and "room for 3" in err
    assert "--max-clients 5" in err and not (tmp_path / "out").exists()
    assert main([*argv, "--max-clients", "0"]) == 2
    assert "--max-clients must be >= 1" in capsys.readouterr().err


def test_the_data_shares_count_a_liar_as_its_capped_weight_stands_for():
    """δ comes from the same checked, capped counts as the edges' FedAvg weights: a liar whose
    histogram and count agree at 10⁹ raises its coalition's share to at most twice its
    mates' (c = 0.5), where its raw count would have taken all of it."""
    from fedcure_app.devices import PRESETS
    from cloud_server.state import ClientEntry
    from tests.deployment.test_controller import HOMES, controller

    c = controller(**{"max-client-weight": 0.5})
    honest = np.array([5, 3, 0, 2], np.int64)
    for name, home in HOMES.items():
        counts = honest * (10**8 if name == "c1" else 1)
        c.register(ClientEntry(name, counts, PRESETS["rpi4"], home,
                               num_samples=int(counts.sum())))
    c.start_forming()
    c.form_and_build()
    s = c.strategy
    liar = c.clients["c1"].client_id
    [mates] = [[i for i in co if i != liar] for co in s.coalitions if liar in co]
    assert mates and s.client_samples[liar] == pytest.approx(10 * len(mates))
    assert all(s.client_samples[i] == 10 for i in range(4) if i != liar)
    share = [s.client_samples[list(co)].sum() for co in s.coalitions]
    assert s.delta == pytest.approx(c.cfg.method.kappa * np.array(share) / sum(share))
    m = len(mates)  # the liar's coalition counts its mates twice, not 10⁹ + 10·m
    assert max(s.delta) == pytest.approx(c.cfg.method.kappa * 2 * m / (2 * m + 3 - m))
