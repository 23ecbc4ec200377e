"""The Flower executor against the in-process executor.

Fast tests drive the real ClientApp through a fake Grid in this process (no Ray); the
end-to-end test runs the ServerApp and ClientApps on Flower's Simulation Runtime (virtual
SuperNodes on Ray) and compares the run with the in-process engine on the same configuration.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from fedcure_app.flower import client_app
from fedcure_app.flower.app_config import client_fingerprint, config_from_run_config
from fedcure_app.data import load_dataset
from fedcure_app.flower.edge import EdgeTaskError
from fedcure_app.simulation.engine import (
    SimulationEngine,
    build_federation,
    make_inprocess_executor,
    simulate,
)
from fedcure_app.simulation.flower_executor import (
    DiscoveryError,
    FlowerExecutor,
    discover_clients,
    wait_for_nodes,
)
from fedcure_app.flower.run import full_run_config, run_flower_simulation
from fedcure_app.tasks import EdgeTask

from .fake_grid import FakeGrid, task_identity

TINY = {
    "dataset": "digits", "num-clients": 6, "num-edges": 2, "global-rounds": 4,
    "tau-e": 2, "tau-c": 2, "eval-every": 2, "seed": 1, "lr": 0.05, "method": "fedcure",
}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.fixture(autouse=True)
def _identity():
    with task_identity():
        yield


def clientapp_grid(run_config: dict, num_nodes: int, *, first_node: int = 500,
                   node_config: dict | None = None) -> FakeGrid:
    """Nodes first_node.. running the real ClientApp in this process (partition-id = index)."""

    def node(i: int):
        ctx = Context(run_id=1, node_id=first_node + i,
                      node_config={"partition-id": i, "num-partitions": num_nodes,
                                   **(node_config or {})},
                      state=RecordDict(), run_config=dict(run_config))
        return lambda msg: client_app.app(msg, ctx)

    # shuffled registration order: node ids do not follow client ids
    order = list(np.random.default_rng(0).permutation(num_nodes))
    return FakeGrid({first_node + 7 * i: node(int(i)) for i in order})


def test_discovery_maps_client_ids_to_nodes_by_partition_id():
    rc = full_run_config(TINY)
    grid = clientapp_grid(rc, 6)
    mapping = discover_clients(grid, 6, timeout_s=5)
    assert sorted(mapping) == list(range(6))
    assert len(set(mapping.values())) == 6
    # every query reply came from the node holding that partition
    for c, n in mapping.items():
        assert (n - 500) % 7 == 0
    with pytest.raises(DiscoveryError, match="only 6 of 8 SuperNodes registered"):
        discover_clients(grid, 8, timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(DiscoveryError, match="num-supernodes=8"):
        wait_for_nodes(grid, 8, timeout_s=60, stall_s=0.1)
    assert time.monotonic() - t0 < 5


def test_flower_executor_trains_like_the_inprocess_executor(digits):
    rc = full_run_config(TINY)
    cfg = config_from_run_config(rc)
    fed = build_federation(cfg, digits)
    inproc = make_inprocess_executor(fed)
    grid = clientapp_grid(rc, 6)
    flower = FlowerExecutor(grid, 6, poll_s=0.001,
                            extra_config={"data-key": client_fingerprint(cfg)})
    coalition = fed.coalitions[0]
    task = EdgeTask(
        task_id="t", coalition=0, version=0, arrays=fed.initial_arrays,
        clients=tuple(coalition), frequencies_ghz={c: 0.9 for c in coalition},
        tau_e=2, tau_c=3, lr=0.05, batch_size=16, seed=99,
    )
    a = inproc.run(task)
    b = flower.run(task)
    assert b.num_samples == a.num_samples
    assert b.dropped == []
    for x, y in zip(a.arrays, b.arrays):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert [(r.client, r.edge_round, r.samples) for r in a.reports] == \
        [(r.client, r.edge_round, r.samples) for r in b.reports]
    np.testing.assert_allclose([r.loss for r in a.reports], [r.loss for r in b.reports],
                               rtol=1e-5)
    # the emulated throttle clamps to the device range and stretches the measured time
    prof = fed.population
    for r in b.reports:
        f = min(max(0.9, prof.f_min_ghz[r.client]), prof.f_max_ghz[r.client])
        assert r.f_applied_ghz == pytest.approx(f)
        assert r.seconds > 0
    assert flower.stats.tasks == 1 and flower.stats.edge_rounds == 2


def test_engine_with_flower_executor_on_a_fake_grid_matches_inprocess(digits):
    rc = full_run_config(TINY)
    cfg = config_from_run_config(rc)
    ref = simulate(cfg, dataset=digits)
    fed = build_federation(cfg, digits)
    ex = FlowerExecutor(clientapp_grid(rc, 6), 6, poll_s=0.001)
    res = SimulationEngine(fed, ex).run()
    assert trace(res) == trace(ref)
    assert res["final_accuracy"] == pytest.approx(ref["final_accuracy"], abs=0.01)


def test_clientapp_refuses_a_task_for_other_data():
    rc = full_run_config(TINY)
    other = config_from_run_config({**rc, "seed": 2})
    grid = clientapp_grid(rc, 6)
    ex = FlowerExecutor(grid, 6, poll_s=0.001,
                        extra_config={"data-key": client_fingerprint(other)})
    cfg = config_from_run_config(rc)
    from fedcure_app.models import build_model, get_weights

    task = EdgeTask(task_id="t", coalition=0, version=0,
                    arrays=get_weights(build_model("digits")), clients=(0, 1),
                    frequencies_ghz={}, tau_e=1, tau_c=1, lr=0.05, batch_size=8, seed=1)
    assert cfg.federation.num_clients == 6
    with pytest.raises(EdgeTaskError, match="describes other clients"):
        ex.run(task)


def test_query_reports_partition_id_and_cpufreq():
    rc = full_run_config(TINY)
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 3, "cpufreq": "off"},
                  state=RecordDict(), run_config=rc)
    msg = Message(RecordDict(), 5, "query")
    msg.metadata.__dict__["_message_id"] = "m1"
    reply = client_app.app(msg, ctx)
    ident = reply.content["identity"]
    assert ident["partition-id"] == 3 and ident["cpufreq"] == "off"


def trace(result: dict) -> list[tuple]:
    """The schedule trace: who arrived when, what was dispatched, at which frequencies."""
    return [
        (r["round"], r["coalition"], round(r["time_s"], 9), r["staleness"], r["version"],
         tuple(r["dispatched"]), round(r["latency_s"], 9),
         tuple(sorted((k, round(v, 9)) for k, v in r["frequencies_ghz"].items())))
        for r in result["records"]
    ]


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("flwr")
    with pytest.MonkeyPatch.context() as mp:  # Flower writes its "source" id to $FLWR_HOME
        mp.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr-home")))
        res = run_flower_simulation({**TINY, "out-dir": str(out), "run-folders": True},
                                    client_num_cpus=1.0)
    return out, res


def test_end_to_end_on_the_simulation_runtime_matches_the_inprocess_run(flower_run, digits):
    out, res = flower_run
    for key in ("config", "dataset", "initial_accuracy", "final_accuracy", "best_accuracy",
                "rounds", "simulated_seconds", "energy_j", "latency_cov", "wall_seconds",
                "coalitions", "initial_jsd", "formed_jsd", "participation", "records",
                "flower"):
        assert key in res, key
    assert res["config"]["run"]["executor"] == "flower"
    assert res["rounds"] == 4
    assert (out / "latest").read_text() == "0\n"  # the in-process API's run id is 0
    assert (out / "0" / "result.json").is_file()
    assert sorted(p.name for p in (out / "0").glob("*.png")) == [
        "accuracy.png", "participation.png", "queues.png"]
    # the run's model: a torch.export program that takes pixels / 16 (digits) and scores the
    # run's final accuracy
    import torch

    program = torch.export.load(str(out / "0" / "model.pt2")).module()
    raw = digits.x_test * np.float32(digits.std[0]) + np.float32(digits.mean[0])
    with torch.no_grad():
        pred = program(torch.from_numpy(raw)).argmax(1).numpy()
    assert abs(float((pred == digits.y_test).mean()) - res["final_accuracy"]) < 1e-3
    fl = res["flower"]
    assert fl["dropped"] == [] and fl["edge_rounds"] == 2 * fl["tasks"] and fl["tasks"] >= 4
    assert sorted(int(c) for c in fl["node_of_client"]) == list(range(6))

    cfg = config_from_run_config(full_run_config(TINY))
    ref = simulate(cfg, dataset=digits)
    assert trace(res) == trace(ref)
    assert res["coalitions"] == ref["coalitions"]
    assert res["participation"]["rounds"] == ref["participation"]["rounds"]
    assert abs(res["final_accuracy"] - ref["final_accuracy"]) <= 0.01


def test_only_a_ray_start_up_timeout_is_retried():
    from fedcure_app.flower.run import ray_failed_to_start

    def chain(*messages: str) -> BaseException:
        err: BaseException | None = None
        for m in messages:
            try:
                raise RuntimeError(m) from err
            except RuntimeError as new:
                err = new
        assert err is not None
        return err

    assert ray_failed_to_start(chain("The current node timed out during startup. This could",
                                     "Simulation Runtime crashed.", "Ending simulation."))
    assert not ray_failed_to_start(chain("ClientApp raised ValueError", "Ending simulation."))


def test_fewer_virtual_supernodes_than_clients_take_turns():
    """Flower's default federation (2 virtual SuperNodes) serves a 6-client run: client c
    trains on the node of partition c mod 2, and the train messages say the node is shared."""
    rc = full_run_config(TINY)
    grid = clientapp_grid(rc, 2)
    with pytest.raises(DiscoveryError, match="only 2 of 6 SuperNodes registered"):
        discover_clients(grid, 6, timeout_s=0.2)
    mapping = discover_clients(grid, 6, timeout_s=5, share_nodes=True)
    part_of_node = {500 + 7 * i: None for i in range(2)}
    assert sorted(mapping) == list(range(6)) and set(mapping.values()) == set(part_of_node)
    assert mapping[0] == mapping[2] == mapping[4] != mapping[1] == mapping[3] == mapping[5]
    executor = FlowerExecutor(grid, 6, poll_s=0.001, share_nodes=True,
                              extra_config={"data-key": client_fingerprint(
                                  config_from_run_config(rc))})
    assert executor.extra_config["node-shared"] is True


def test_shared_mapping_only_for_a_complete_simulated_federation():
    from fedcure_app.simulation.flower_executor import shared_mapping

    sim = {10: {"partition-id": 0, "num-partitions": 2}, 11: {"partition-id": 1,
                                                              "num-partitions": 2}}
    assert shared_mapping(sim, 5) == {0: 10, 1: 11, 2: 10, 3: 11, 4: 10}
    assert shared_mapping(sim, 2) is None  # one node per client: the usual mapping
    assert shared_mapping({10: sim[10]}, 5) is None  # node 1 not registered yet
    assert shared_mapping({10: {"client-id": 0}, 11: {"client-id": 1}}, 5) is None
