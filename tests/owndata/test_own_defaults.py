"""One set of defaults for a task wherever it runs: the Flower app's ``[tool.flwr.app.config]``
holds the configuration's defaults (only the demo's size differs), the compose overlay for own
data hands the cloud no hyperparameter of its own, and a configuration file's values that
differ from the defaults are said at the cloud's start."""

from __future__ import annotations

import tomllib
from pathlib import Path

from fedcure_app.config import FedCureConfig
from fedcure_app.flower.app_config import DEMO_SIZE_KEYS, config_from_run_config
from fedcure_app.flower.app_config import default_run_config

ROOT = Path(__file__).resolve().parents[2]


def flower_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_the_flower_apps_defaults_are_the_configurations_but_the_demos_size():
    table, defaults = flower_table(), default_run_config()
    by_method = {"method", "formation", "scheduler"}  # "": the method preset's rules
    differ = {k for k, v in table.items() if k in defaults and k not in by_method
              and v != defaults[k]}
    assert differ == set(DEMO_SIZE_KEYS), differ
    # the same method knobs once parsed (the method preset names the default rules)
    got = config_from_run_config(table).model_dump()
    want = FedCureConfig().model_dump()
    for section in ("method", "reliability", "devices"):
        assert got[section] == want[section], section
    assert got["run"]["eval_every"] == want["run"]["eval_every"]
    assert got["data"]["holdout"] == want["data"]["holdout"]


def test_the_cloud_says_at_start_what_its_config_file_changes(caplog):
    import logging

    from cloud_server.cli import build_parser, make_config

    args = build_parser().parse_args(["--listen", "127.0.0.1:0", "--expected-clients", "4",
                                      "--edges", "2", "--config",
                                      str(ROOT / "docker" / "fedcure.toml")])
    with caplog.at_level(logging.INFO, logger="fedcure.cloud"):
        make_config(args)
    (line,) = [r.getMessage() for r in caplog.records if "--config" in r.getMessage()]
    assert "tau-c 20 (default 5)" in line and "tau-e 2 (default 12)" in line
    assert "lr 0.05 (default 0.01)" in line and "\n" not in line


def test_the_own_data_overlay_sets_no_hyperparameter_of_the_task():
    """Compose's cloud on own data reads docker/own-data.toml (deployment settings), never the
    digits demo's docker/fedcure.toml: the task trains with the defaults."""
    import yaml

    from fedcure_app.config import load_config
    from cloud_server.config_changes import changed_knobs

    cloud = yaml.safe_load((ROOT / "docker" / "own-data.yaml").read_text())["services"]["cloud"]
    assert "--config=/etc/fedcure/own-data.toml" in cloud["command"]
    assert not any("fedcure.toml" in str(v) for v in cloud["command"] + cloud["volumes"])
    changed = {k.split()[0] for k in changed_knobs(load_config(ROOT / "docker" /
                                                               "own-data.toml"))}
    assert changed == {"eval-every", "deadline-min-s"}  # when to evaluate, how long to wait
