"""The shared Flower helpers: console scripts and generated app directories, for the simulation
(:mod:`fedcure_app.flower.run`) and the edge role (``edge_server.superlink``) alike."""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from pathlib import Path

from flwr.serverapp import ServerApp

from edge_server.superlink import EDGE_SERVERAPP
from edge_server.superlink import write_app_dir as write_edge_app_dir
from fedcure_app.errors import UsageError
from fedcure_app.flower.tools import CLIENTAPP, SIMULATION_SERVERAPP, flower_bin, write_app_dir


def _load(component: str):
    module, _, attr = component.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_flower_bin_prefers_the_script_next_to_this_python():
    here = Path(sys.executable).parent
    assert flower_bin("flwr") == (str(here / "flwr") if (here / "flwr").exists() else "flwr")
    assert flower_bin("no-such-flower-script") == "no-such-flower-script"


def test_app_dir_declares_the_components_and_the_whole_run_config(tmp_path):
    rc = {"num-clients": 6, "method": "greedy", "lr": 0.01, "out-dir": "/tmp/x"}
    out = write_app_dir(tmp_path / "app" / "nested", rc)
    assert out == tmp_path / "app" / "nested"
    app = tomllib.loads((out / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": SIMULATION_SERVERAPP, "clientapp": CLIENTAPP}
    assert app["config"] == rc
    assert app["publisher"] == "fedcure"


def test_the_edge_submits_its_own_serverapp(tmp_path):
    out = write_edge_app_dir(tmp_path / "app", {"role": "edge", "edge-file": "/e.json"})
    app = tomllib.loads((out / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": EDGE_SERVERAPP, "clientapp": CLIENTAPP}
    assert isinstance(_load(EDGE_SERVERAPP), ServerApp)
    assert isinstance(_load(SIMULATION_SERVERAPP), ServerApp)
    assert _load(EDGE_SERVERAPP) is not _load(SIMULATION_SERVERAPP)


def test_every_command_raises_the_same_usage_error():
    import client.cli
    import edge_server.cli

    assert client.cli.UsageError is UsageError
    assert edge_server.cli.UsageError is UsageError
    assert issubclass(UsageError, ValueError)


def test_ray_node_metric_names_the_ray_node_only_inside_ray(monkeypatch):
    from types import SimpleNamespace

    from fedcure_app.flower.tools import ray_node_metric

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert ray_node_metric() == {}
    node = "0123456789abcdef" * 3
    ray = SimpleNamespace(
        is_initialized=lambda: True,
        get_runtime_context=lambda: SimpleNamespace(get_node_id=lambda: node),
    )
    monkeypatch.setitem(sys.modules, "ray", ray)
    assert ray_node_metric() == {"ray-node": int(node[:12], 16)}
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: False))
    assert ray_node_metric() == {}


def test_flower_env_puts_this_pythons_scripts_first_on_path(monkeypatch):
    import shutil

    from fedcure_app.runtime.processes import flower_env, scripts_dirs

    first = scripts_dirs()[0]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = flower_env("/tmp/flwr-home")
    assert env["PATH"].split(os.pathsep)[0] == first
    assert env["PATH"].endswith("/usr/bin:/bin")
    superexec = shutil.which("flower-superexec", path=env["PATH"])
    assert superexec is not None and os.path.dirname(superexec) in scripts_dirs()
    monkeypatch.setenv("PATH", f"/usr/bin:{first}:/bin")  # already there: moved first, once
    assert flower_env("/tmp/h")["PATH"].split(os.pathsep).count(first) == 1


def test_a_venvs_scripts_are_found_beside_its_unresolved_interpreter(monkeypatch, tmp_path):
    import fedcure_app.runtime.processes as processes

    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)  # a venv's python: a symlink elsewhere
    tool = venv_bin / "flower-superexec"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(processes.sys, "executable", str(venv_bin / "python"))
    monkeypatch.setattr(processes.sysconfig, "get_path", lambda name: str(tmp_path / "none"))
    assert processes.scripts_dirs() == [str(venv_bin)]
    assert flower_bin("flower-superexec") == str(tool)
    assert processes.path_with_scripts("/usr/bin").split(os.pathsep) == [str(venv_bin),
                                                                         "/usr/bin"]


def test_the_edge_superexec_asks_for_serverapps_at_flowers_pace_not_every_50_ms(tmp_path):
    """Every other Flower process FedCure starts polls its SuperExec every 50 ms; the edge's
    starts one ServerApp and keeps asking for as long as the edge lives, each ask a request its
    SuperLink answers, so it asks once a second."""
    from edge_server.superlink import superlink_env
    from fedcure_app.runtime.processes import FLOWER_OFFLINE_ENV

    env = superlink_env(tmp_path)
    assert float(env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]) >= 1.0
    assert float(FLOWER_OFFLINE_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]) < 1.0
    assert env["FLWR_HOME"] == str(tmp_path / "flwr-home")
