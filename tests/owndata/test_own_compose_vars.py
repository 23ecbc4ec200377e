"""The own-data compose overlay needs its run's variables (FEDCURE_TASK, FEDCURE_CLIENTS_DATA)
only when ``up`` starts a run: a one-shot check service the cloud waits for refuses the run in
one line without them, and ``down -v`` (or ``config``) in a new shell works without them, with
docker-compose v1 and ``docker compose`` v2 alike."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
FILES = ("compose.yaml", "own-data.yaml")
VARS = ("FEDCURE_TASK", "FEDCURE_CLIENTS_DATA")


def overlay() -> dict:
    return yaml.safe_load((DOCKER / "own-data.yaml").read_text())


def test_no_compose_value_is_mandatory_at_parse_time():
    for name in FILES:
        assert ":?" not in (DOCKER / name).read_text(), name


def test_up_waits_for_a_check_that_refuses_a_run_without_its_variables(tmp_path):
    services = overlay()["services"]
    assert services["cloud"]["depends_on"]["check"] == {
        "condition": "service_completed_successfully"}
    sh, flag, script = services["check"]["command"]
    script = script.replace("$$", "$")  # compose's escape of a literal $
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    for given, missing in (({}, "FEDCURE_TASK"), ({"FEDCURE_TASK": "/t.toml"},
                                                  "FEDCURE_CLIENTS_DATA")):
        done = subprocess.run([sh, flag, script], env={**env, **given}, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 2 and done.stderr.strip().startswith(f"set {missing} ")
    done = subprocess.run([sh, flag, script], env={**env, "FEDCURE_TASK": "/t.toml",
                                                   "FEDCURE_CLIENTS_DATA": "/c"}, timeout=30)
    assert done.returncode == 0


def compose_commands() -> list[list[str]]:
    found = []
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                  capture_output=True, timeout=60
                                                  ).returncode == 0:
        found.append(["docker", "compose"])
    return found


@pytest.mark.parametrize("compose", compose_commands() or [None],
                         ids=lambda c: " ".join(c) if c else "none")
def test_down_needs_none_of_the_runs_variables(compose):
    if compose is None:
        pytest.skip("neither docker-compose nor docker compose is installed")
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    args = [a for f in FILES for a in ("-f", str(DOCKER / f))]
    done = subprocess.run([*compose, *args, "config", "--quiet"], env=env, cwd=DOCKER,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
