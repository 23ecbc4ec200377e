"""Flower's ``data-path`` node config under the FedCure ClientApp: a SuperNode that names its
own data (and its partition id) trains on it under the run config's task, exactly as
``fedcure-client --data`` would; the node data file it builds goes to the cache folder, never
into the data folder, and is built once."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedcure_app.data.task import parse_task
from fedcure_app.flower import client_app
from fedcure_app.flower.app_config import default_run_config

TASK = parse_task({"classes": ["lo", "hi"], "kind": "tabular", "features": 3})


def context(node_config: dict) -> Context:
    rc = default_run_config()
    rc["task"] = TASK.model_dump_json(by_alias=True)
    rc["num-clients"], rc["num-edges"], rc["num-classes"] = 2, 1, 2
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config=rc)


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCURE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "mine"
    folder.mkdir()
    rows = "\n".join(f"{i},{i % 5},{i % 3},{'lo' if i % 2 else 'hi'}" for i in range(40))
    (folder / "rows.csv").write_text("a,b,c,label\n" + rows + "\n")
    client_app._deployed.clear()
    return tmp_path, folder / "rows.csv"


def test_a_data_path_node_trains_on_its_own_rows(data):
    tmp_path, csv = data
    state = client_app.deployed_state(context({"data-path": str(csv), "partition-id": 1}))
    assert state is not None and state.client == 1
    assert state.x.shape == (36, 3) and state.data.y_test.shape == (4,)
    assert sorted(np.unique(state.y.numpy()).tolist()) == [0, 1]
    assert state.model(state.x[:2]).shape == (2, 2)
    built = list((tmp_path / "cache" / "nodes").glob("*.npz"))
    assert len(built) == 1
    assert sorted(p.name for p in csv.parent.iterdir()) == ["rows.csv"]  # nothing written there
    client_app._deployed.clear()
    again = client_app.deployed_state(context({"data-path": str(csv), "partition-id": 1}))
    assert again is not None and list((tmp_path / "cache" / "nodes").glob("*.npz")) == built


def test_a_data_path_node_logs_its_label_counts_by_class_name(data, caplog):
    _, csv = data
    from fedcure_app.flower import own_node

    caplog.set_level("INFO", logger="flwr")
    for _ in range(2):  # a message each: one line
        client_app.deployed_state(context({"data-path": str(csv), "partition-id": 1}))
    own_node._logged.clear()  # another process, the file already built
    client_app._deployed.clear()
    client_app.deployed_state(context({"data-path": str(csv), "partition-id": 1}))
    lines = [r.getMessage() for r in caplog.records if "data-path holds" in r.getMessage()]
    assert len(lines) == 2 and "built into" in lines[0] and "cached in" in lines[1]
    for line in lines:
        assert "node 1: data-path holds task, 36 samples (label counts {lo: 18, hi: 18}, " \
               "4 held out;" in line, line


def test_a_data_path_node_needs_an_identity_and_a_task(data):
    _, csv = data
    with pytest.raises(ValueError, match="no client-id or partition-id"):
        client_app.deployed_state(context({"data-path": str(csv)}))
    ctx = context({"data-path": str(csv), "partition-id": 0})
    ctx.run_config["task"] = ""
    with pytest.raises(ValueError, match="needs a run config with a task"):
        client_app.deployed_state(ctx)
