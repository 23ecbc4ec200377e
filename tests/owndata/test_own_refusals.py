"""A refused client under ``fedcure simulate`` (and the Flower app) is treated as ``fedcure
launch`` treats one: one ``NAME refused: …`` line, the run goes on with the other clients,
``result.json`` lists it under ``withdrawn``; the run fails only when fewer clients than edges
are left. Clients go by their entry's name (``site-1.csv`` is ``site-1``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedcure_app.cli import main
from fedcure_app.data.task import parse_task, task_toml

TASK = parse_task({"classes": ["lo", "hi"], "kind": "tabular", "features": 2})


def write_clients(root: Path, good: int, bad: tuple[str, ...] = ("site-9",)) -> None:
    """``good`` CSV clients of 20 rows and, for each name in ``bad``, one whose label column
    holds a class the task does not have."""
    root.mkdir(parents=True)
    for i in range(good):
        rows = "\n".join(f"{j},{j * (i + 1) % 7},{'lo' if j % 2 else 'hi'}" for j in range(20))
        (root / f"site-{i}.csv").write_text("a,b,label\n" + rows + "\n")
    for name in bad:
        (root / f"{name}.csv").write_text("a,b,label\n1,2,zebra\n3,4,lo\n")


def simulate(tmp_path: Path, clients: Path, edges: int) -> tuple[int, Path]:
    (tmp_path / "task.toml").write_text(task_toml(TASK))
    out = tmp_path / "out"
    code = main(["simulate", "--task", str(tmp_path / "task.toml"), "--clients-data",
                 str(clients), "--edges", str(edges), "--rounds", "2", "--tau-e", "1",
                 "--workers", "1", "--no-progress", "--out", str(out)])
    return code, out


def test_simulate_refuses_a_bad_client_in_one_line_and_trains_the_others(tmp_path, caplog):
    write_clients(tmp_path / "clients", good=3)
    with caplog.at_level(logging.WARNING):
        code, out = simulate(tmp_path, tmp_path / "clients", edges=2)
    assert code == 0
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].startswith("site-9 refused: ")
    assert "zebra" in refused[0] and "\n" not in refused[0]
    result = json.loads((out / "result.json").read_text())
    assert result["clients"] == ["site-0", "site-1", "site-2"]
    assert list(result["withdrawn"]) == ["site-9"] and "zebra" in result["withdrawn"]["site-9"]
    assert result["config"]["federation"]["num-clients"] == 3
    assert sorted(c for coalition in result["coalitions"] for c in coalition) == [0, 1, 2]


def test_simulate_fails_in_one_line_when_fewer_clients_than_edges_are_left(tmp_path, capsys):
    write_clients(tmp_path / "clients", good=1, bad=("site-8", "site-9"))
    code, _ = simulate(tmp_path, tmp_path / "clients", edges=2)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "1 of 3 clients left after refusals (site-8, site-9), fewer than the 2 edges" \
        in err[-1]


def test_the_flower_clients_and_server_agree_on_the_clients_left(tmp_path):
    """A ClientApp drops the refused client as the ServerApp does: client ids index the clients
    left, and both sides still name the same run (the fingerprint of the run config)."""
    from fedcure_app.flower.app_config import client_fingerprint
    from fedcure_app.flower.server_app import simulation_config
    from fedcure_app.flower.sim_clients import client_state
    from fedcure_app.simulation.engine import build_federation

    write_clients(tmp_path / "clients", good=3)
    (tmp_path / "task.toml").write_text(task_toml(TASK))
    rc = {"task": str(tmp_path / "task.toml"), "clients-data": str(tmp_path / "clients"),
          "num-edges": 2}
    cfg = simulation_config(rc)
    assert cfg.federation.num_clients == 4  # the folder's entries, before any is read
    state = client_state(cfg)
    fed = build_federation(cfg)
    assert state.cfg.federation.num_clients == fed.cfg.federation.num_clients == 3
    assert state.fingerprint == client_fingerprint(cfg)
    assert [len(ix) for ix in state.client_indices] == [len(ix) for ix in
                                                        fed.partition.client_indices]
    assert len(state.profiles) == 3


@pytest.mark.parametrize("entry, name", [("site-1.csv", "site-1"), ("x.NPZ", "x"),
                                         ("client-00", "client-00"), ("a.b", "a.b")])
def test_a_client_is_named_after_its_entry(entry, name):
    from fedcure_app.data.names import client_name

    assert client_name(Path("/data") / entry) == name


def test_a_hand_started_client_keeps_its_name_from_run_to_run(tmp_path):
    from fedcure_app.data.names import default_name

    data = tmp_path / "pi-data"
    assert default_name(str(data), host="pi4") == "pi4-pi-data" == \
        default_name(str(data), host="pi4")
    assert default_name(None, 3, host="pi4") == "pi4-p3"
    assert default_name(host="pi4") == "pi4"
    assert default_name(str(tmp_path / "x.csv"), host="h") == "h-x"


def test_launch_starts_each_client_under_its_entrys_name(tmp_path, monkeypatch):
    """``fedcure launch`` passes ``--name site-0`` … (the entries' names, not ``client-0``),
    so logs, ``result.json`` and the coalitions name the clients as ``simulate`` does."""
    from fedcure_app.cli import build_parser, launch
    from tests.launch_children import record_children

    started = record_children(monkeypatch)
    write_clients(tmp_path / "clients", good=2, bad=())
    (tmp_path / "task.toml").write_text(task_toml(TASK))
    args = build_parser().parse_args(["launch", "--task", str(tmp_path / "task.toml"),
                                      "--clients-data", str(tmp_path / "clients"),
                                      "--edges", "1", "--no-dashboard"])
    record = launch.start_roles(launch.config_from_args(args), args, tmp_path, launch.Roles())
    names = [c.argv[c.argv.index("--name") + 1] for c in started if c.name.startswith("client")]
    assert names == ["site-0", "site-1"]
    assert [c.client_name for c in started if c.name.startswith("client")] == names
    assert [record["clients"][i]["name"] for i in (0, 1)] == names


def test_a_tasks_client_ids_follow_the_names_not_the_order_they_came_in():
    """Own data: ids by sorted names once registration closes, so the same fleet forms the
    same coalitions whichever client came first (a built-in dataset keeps its partition order)."""
    from types import SimpleNamespace

    from cloud_server.registry import Registry
    from cloud_server.state import Roster
    from tests.deployment.fakes import make_cfg
    from tests.owndata.test_own_registration import task_cfg

    for cfg, want in ((task_cfg(), ["pi-a", "pi-b", "pi-c"]),
                      (make_cfg(3, 2), ["pi-c", "pi-a", "pi-b"])):
        reg = Registry(cfg, Roster(num_edges=2, expected_clients=3))
        for name in ("pi-c", "pi-a", "pi-b"):  # the order they came in
            reg.claim(name, None)
            reg.roster.clients[name] = SimpleNamespace(name=name)
        assert [c.name for c in reg.ordered()] == want
