"""Run config <-> FedCureConfig for the Flower apps, and the pyproject's Flower App table."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from fedcure_app.flower.app_config import (
    app_options,
    client_fingerprint,
    config_from_run_config,
    default_run_config,
)
from fedcure_app.config import ConfigError, FedCureConfig, flat_keys
from fedcure_app.federation import partition_for, profiles_for
from fedcure_app.flower.server_app import resolve_out_dir, simulation_config

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.fixture(scope="module")
def flwr_table() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]


def test_pyproject_declares_the_flower_app(flwr_table):
    app = flwr_table["app"]
    assert app["publisher"] == "fedcure"
    assert app["components"] == {"serverapp": "fedcure_app.flower.server_app:app",
                                 "clientapp": "fedcure_app.flower.client_app:app"}
    # federations live in $FLWR_HOME/config.toml in Flower 1.41; a [tool.flwr.federations]
    # table would make `flwr run` migrate it and rewrite pyproject.toml
    assert "federations" not in flwr_table


def test_every_knob_can_be_overridden_with_run_config(flwr_table):
    table = flwr_table["app"]["config"]
    # the ServerApp trains through ClientApps; the peers and the time budget run on the
    # simulated clock only (fedcure simulate refuses them with --executor flower)
    simulator_only = {"executor", "cuda-graphs", "peer", "fraction", "buffer-k", "concurrency",
                      "server-lr", "tiers", "frequency", "time-budget-s", "eval-every-s"}
    want = set(flat_keys()) - simulator_only | {"method"}
    assert want <= set(table), want - set(table)
    assert set(table) == set(default_run_config()) - simulator_only
    for key in ("dataset", "method", "num-clients", "num-edges", "global-rounds", "seed",
                "eval-every", "tau-c", "tau-e", "out-dir"):
        assert key in table
    cfg = config_from_run_config(table)
    assert cfg.data.dataset == "digits" and cfg.federation.num_clients == 10
    assert (cfg.method.formation, cfg.method.scheduler) == ("fedcure", "fedcure")
    assert cfg.data.data_dir is None and cfg.method.max_concurrent is None
    assert app_options(table).out_dir == "results/flwr"


def test_overrides_method_then_formation_and_scheduler(flwr_table):
    table = flwr_table["app"]["config"]
    cfg = config_from_run_config({**table, "num-clients": 20, "method": "greedy"})
    assert cfg.federation.num_clients == 20
    assert (cfg.method.formation, cfg.method.scheduler) == ("none", "greedy")
    cfg = config_from_run_config({**table, "method": "fedcure", "scheduler": "random",
                                  "max-concurrent": 2, "mix": "rpi4, laptop"})
    assert (cfg.method.formation, cfg.method.scheduler) == ("fedcure", "random")
    assert cfg.concurrency == 2 and cfg.devices.mix == ["rpi4", "laptop"]
    assert cfg.devices.edge_access_mbps == [100.0, 50.0, 20.0, 10.0, 5.0]
    assert config_from_run_config({**table, "edge-access-mbps": "40, 2.5"}
                                  ).devices.edge_access_mbps == [40.0, 2.5]
    assert config_from_run_config({**table, "edge-access-mbps": ""}).devices.edge_access_mbps == []
    with pytest.raises(ConfigError, match="edge-access-mbps"):
        config_from_run_config({**table, "edge-access-mbps": "fast"})
    with pytest.raises(ConfigError):
        config_from_run_config({**table, "edge-access-mbps": "10,0"})
    assert simulation_config(table).run.executor == "flower"


def test_bad_keys_and_values_are_refused():
    with pytest.raises(ConfigError, match="unknown configuration key 'num-client'"):
        config_from_run_config({"num-client": 3})
    with pytest.raises(ConfigError):
        config_from_run_config({"num-clients": 2, "num-edges": 3})
    with pytest.raises(ConfigError, match="role"):
        app_options({"role": "cloud"})
    with pytest.raises(ConfigError, match="cpufreq"):
        app_options({"cpufreq": "turbo"})
    assert app_options({"edge-timeout": 30}).edge_timeout_s == 30.0
    assert app_options({}).edge_timeout_s is None


def test_fingerprint_follows_the_client_data():
    a = config_from_run_config({"num-clients": 6, "num-edges": 2})
    assert client_fingerprint(a) == client_fingerprint(config_from_run_config(
        {"num-clients": 6, "num-edges": 2, "tau-e": 3, "beta": 2.0}))
    for change in ({"seed": 1}, {"partition": "iid"}, {"num-clients": 7}, {"mix": "rpi4"}):
        b = config_from_run_config({"num-clients": 6, "num-edges": 2, **change})
        assert client_fingerprint(a) != client_fingerprint(b), change


def test_clients_get_the_engines_partition_and_devices():
    from fedcure_app.data import load_dataset
    from fedcure_app.simulation.engine import build_federation

    ds = load_dataset("digits")
    for over in ({}, {"partition": "dirichlet", "seed": 3}, {"mix": "rpi4,jetson-nano"}):
        cfg = config_from_run_config({"num-clients": 9, "num-edges": 3, **over})
        fed = build_federation(cfg, ds)
        part = partition_for(cfg, ds)
        for a, b in zip(part.client_indices, fed.partition.client_indices):
            np.testing.assert_array_equal(a, b)
        profs = profiles_for(cfg)
        np.testing.assert_array_equal([p.f_max_ghz for p in profs], fed.population.f_max_ghz)
        np.testing.assert_array_equal([p.kappa for p in profs], fed.population.kappa)


def test_out_dir_resolution(tmp_path):
    assert resolve_out_dir("results/flwr", cwd=tmp_path) == tmp_path / "results" / "flwr"
    assert resolve_out_dir(str(tmp_path / "x")) == tmp_path / "x"
    assert resolve_out_dir("~/r").is_absolute()
    assert FedCureConfig().run.executor == "inprocess"
