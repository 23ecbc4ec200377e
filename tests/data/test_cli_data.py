"""``fedcure data info``."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fedcure_app.cli import main
from tests.data.builders import write_mnist


def test_digits_with_partition_writes_json_and_plot(tmp_path: Path, capsys):
    out, png = tmp_path / "info.json", tmp_path / "info.png"
    rc = main(["data", "info", "--dataset", "digits", "--partition", "edge-noniid",
               "--clients", "10", "--edges", "5", "--seed", "1", "--json", str(out),
               "--plot", str(png)])
    assert rc == 0
    d = json.loads(out.read_text())
    for key in ("train_size", "test_size", "num_classes", "class_counts",
                "client_label_counts", "initial_assignment", "initial_jsd"):
        assert key in d
    assert (d["train_size"], d["test_size"], d["num_classes"]) == (1437, 360, 10)
    assert sum(d["class_counts"]["train"]) == 1437 and sum(d["class_counts"]["test"]) == 360
    assert len(d["client_label_counts"]) == 10 and d["initial_assignment"] == [
        0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert math.isclose(d["initial_jsd"], math.log(2), abs_tol=1e-9)
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    assert "initial average pairwise JSD: 0.6931" in text and "1437" in text


def test_without_partition_only_dataset_keys(tmp_path: Path):
    out = tmp_path / "info.json"
    write_mnist(tmp_path / "data" / "raw")
    assert main(["data", "info", "--dataset", "mnist", "--data-dir", str(tmp_path / "data"),
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["train_size"] == 12 and d["test_size"] == 5 and "initial_jsd" not in d


def test_missing_dataset_is_one_line_exit_2(tmp_path: Path, capsys):
    rc = main(["data", "info", "--dataset", "mnist", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"fedcure data: error: --data-dir {tmp_path}: MNIST not found")
    assert err.count("\n") == 1
    assert "train-images-idx3-ubyte" in err


def test_plot_needs_partition(tmp_path: Path, capsys):
    assert main(["data", "info", "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot needs --partition" in capsys.readouterr().err


def test_impossible_partition_exit_2(capsys):
    assert main(["data", "info", "--partition", "iid", "--clients", "2000",
                 "--edges", "5"]) == 2
    assert "only 1437 samples" in capsys.readouterr().err
