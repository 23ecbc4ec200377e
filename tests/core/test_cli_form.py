"""``fedcure form``: argument handling, JSON output, the paper's setting."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from fedcure_app.cli import form


def _parse(argv):
    parser = argparse.ArgumentParser(prog="fedcure")
    sub = parser.add_subparsers(dest="command")
    form.register(sub)
    return parser.parse_args(["form", *argv])


def test_paper_setting_json(tmp_path, capsys):
    out = tmp_path / "deep" / "dir" / "form.json"
    args = _parse(["--clients", "50", "--edges", "5", "--classes", "10",
                   "--partition", "edge-noniid", "--rule", "fedcure", "--json", str(out)])
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    for key in ("initial_jsd", "final_jsd", "moves", "stable", "jsd_trajectory", "coalitions",
                "arguments"):
        assert key in data
    assert abs(data["initial_jsd"] - math.log(2)) <= 0.01
    assert data["final_jsd"] <= 0.01 and data["stable"] is True
    traj = data["jsd_trajectory"]
    assert all(b <= a for a, b in zip(traj, traj[1:]))
    assert sorted(sum(data["coalitions"], [])) == list(range(50))
    assert data["arguments"]["rule"] == "fedcure" and data["arguments"]["clients"] == 50
    printed = capsys.readouterr().out
    assert "0.6931" in printed and str(out) in printed


@pytest.mark.parametrize("rule", ["selfish", "pareto", "kmeans", "meanshift", "none"])
def test_other_rules(tmp_path, rule):
    out = tmp_path / f"{rule}.json"
    args = _parse(["--clients", "20", "--edges", "4", "--classes", "6", "--partition",
                   "dirichlet", "--alpha", "0.3", "--rule", rule, "--seed", "2",
                   "--max-moves", "50", "--json", str(out)])
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert data["rule"] == rule
    if rule in ("selfish", "pareto", "none"):
        assert data["moves"] <= 50
    assert len(data["coalitions"]) == 4 and all(data["coalitions"])


def test_bad_values_raise_clear_errors():
    with pytest.raises(ValueError, match=r"--edges \(5\) > --clients \(3\)"):
        args = _parse(["--clients", "3", "--edges", "5"])
        args.func(args)
    with pytest.raises(SystemExit):
        _parse(["--partition", "shards"])
    with pytest.raises(ValueError, match="--seed must be >= 0"):
        args = _parse(["--seed", "-1"])
        args.func(args)
