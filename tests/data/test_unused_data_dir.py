"""--data-dir with the bundled digits is not silently ignored: one line says it is not used
(and names a dataset the folder holds), in the fedcure commands and the roles."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

from client.association import config_of
from fedcure_app.cli import main as fedcure_main
from fedcure_app.config import FedCureConfig
from fedcure_app.data.loader import unused_data_dir
from tests.data.builders import write_mnist


def test_the_note_is_for_a_bundled_dataset_with_a_folder_only(tmp_path: Path):
    assert unused_data_dir("mnist", tmp_path) is None
    assert unused_data_dir("digits", None) is None and unused_data_dir("digits", "") is None
    note = unused_data_dir("digits", tmp_path / "nope")
    assert note == (f"--data-dir {tmp_path / 'nope'} is not used: digits is bundled with "
                    "scikit-learn")


def test_the_note_names_the_dataset_the_folder_holds(tmp_path: Path):
    write_mnist(tmp_path / "mnist" / "raw")
    note = unused_data_dir("digits", tmp_path, "data-dir")
    assert note is not None and note.startswith(f"data-dir {tmp_path} is not used")
    assert note.endswith("it holds mnist: add --dataset mnist to train on that")


def test_data_info_says_it_in_one_line_and_still_runs(tmp_path: Path, capsys):
    assert fedcure_main(["data", "info", "--data-dir", str(tmp_path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"fedcure: warning: --data-dir {tmp_path} is not used: digits is bundled "
                   "with scikit-learn"]
    assert fedcure_main(["data", "info"]) == 0  # no folder given: no word
    assert "not used" not in capsys.readouterr().err


def test_simulate_says_it_before_running(tmp_path: Path, capsys):
    assert fedcure_main(["simulate", "--data-dir", str(tmp_path / "nope"), "--rounds", "1",
                         "--clients", "4", "--edges", "2", "--workers", "1",
                         "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err.count("is not used: digits is bundled") == 1


def test_a_client_logs_it_when_the_cloud_runs_digits(tmp_path: Path, caplog):
    reply = SimpleNamespace(config_json=json.dumps(FedCureConfig().model_dump()),
                            num_partitions=FedCureConfig().federation.num_clients)
    args = SimpleNamespace(dataset=None, num_partitions=None, data_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="fedcure.client"):
        config_of(reply, args)
    assert [r.getMessage() for r in caplog.records] == [
        f"--data-dir {tmp_path} is not used: digits is bundled with scikit-learn"]
