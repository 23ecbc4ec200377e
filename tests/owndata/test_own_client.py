"""A deployed client's own data, read in its child (``python -m client.own_data``): the node
data file holds the training and held-out parts and the task; what the client registers with
is the sample count, the histogram over the task's classes and the model's signature; every
refusal is one line and its own exit code; the client's flags are checked before it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedcure_app.config import build_config
from fedcure_app.data.task import parse_task
from fedcure_app.flower.node_data import load_node_data
from client.cli import build_parser, check_own_data_flags
from client.own_data import EXIT_REFUSED
from fedcure_app.errors import UsageError

TASK = parse_task({"classes": ["a", "b", "c"], "kind": "tabular", "features": 2,
                   "mean": [1.0, 0.0], "std": [2.0, 1.0]})


def write_config(tmp_path: Path, task=TASK) -> Path:
    data = build_config({"federation": {"num_clients": 2, "num_edges": 1,
                                        "num_classes": task.num_classes}}).model_dump()
    data["task"] = task.model_dump()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(build_config(data).model_dump(mode="json")))
    return path


def child(tmp_path: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "client.own_data", "--config", str(write_config(tmp_path)),
         "--data", str(data), "--index", "1", "--name", "dev-1",
         "--out", str(tmp_path / "node.npz"), *extra],
        capture_output=True, text=True, timeout=120)


def csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "mine.csv"
    path.write_text("x1,x2,label\n" + "\n".join(rows) + "\n")
    return path


def test_the_child_writes_both_parts_and_prints_what_the_client_registers(tmp_path):
    rows = [f"{i},{i % 3},{'abc'[i % 2]}" for i in range(20)]
    done = child(tmp_path, csv(tmp_path, rows), "--holdout", "0.2")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    node = load_node_data(tmp_path / "node.npz")
    assert facts["samples"] == len(node.y) == 16 and len(node.y_test) == 4
    assert facts["label_counts"] == np.bincount(node.y, minlength=3).tolist()
    assert facts["label_counts"][2] == 0  # class c: none here, still reported
    assert facts["histogram_epsilon"] == 0.0 and facts["home"] == 0
    assert [k for k, _ in facts["model_signature"]][0].endswith("weight")
    assert node.task["classes"] == ["a", "b", "c"] and node.x.dtype == np.float32
    # tabular rows are normalised with the task's mean and std
    raw = np.array([[float(r.split(",")[0]), float(r.split(",")[1])] for r in rows])
    assert np.isclose(node.x[:, 0] * 2.0 + 1.0, raw[:, 0][..., None]).any(axis=0).all()


def test_a_private_histogram_is_noisy_but_the_sample_count_is_exact(tmp_path):
    rows = [f"{i},{i},{'ab'[i % 2]}" for i in range(200)]
    done = child(tmp_path, csv(tmp_path, rows), "--holdout", "0", "--histogram-epsilon", "0.5")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["samples"] == 200 and facts["histogram_epsilon"] == 0.5
    assert all(isinstance(c, int) and c >= 0 for c in facts["label_counts"])


@pytest.mark.parametrize("rows, words", [
    (["1,2,zebra"], "'zebra'"),
    (["1,,a"], "row"),
    (["1,nan,a"], "row"),
])
def test_bad_data_is_refused_in_one_line_with_its_own_exit_code(tmp_path, rows, words):
    done = child(tmp_path, csv(tmp_path, rows * 5))
    assert done.returncode == EXIT_REFUSED, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and words in line
    assert not (tmp_path / "node.npz").exists()


def test_a_missing_label_column_names_the_column(tmp_path):
    done = child(tmp_path, csv(tmp_path, ["1,2,a"] * 5), "--label-column", "kind")
    assert done.returncode == EXIT_REFUSED and "kind" in done.stderr


@pytest.mark.parametrize("argv, words", [
    (["--data", "{missing}"], "no such file"),
    (["--data", "{here}", "--dataset", "mnist"], "--dataset"),
    (["--data", "{here}", "--holdout", "1.5"], "--holdout"),
    (["--data", "{here}", "--histogram-epsilon", "-1"], "--histogram-epsilon"),
    (["--holdout", "0.2"], "only with --data"),
    (["--histogram-epsilon", "1"], "only with --data"),
])
def test_own_data_flags_are_checked_before_anything_starts(tmp_path, argv, words):
    argv = [a.format(missing=tmp_path / "nope", here=tmp_path) for a in argv]
    args = build_parser().parse_args(["--cloud", "127.0.0.1:1", *argv])
    with pytest.raises(UsageError, match=words.replace("-", "\\-")):
        check_own_data_flags(args)
