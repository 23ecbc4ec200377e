"""docker/own-data.yaml is what docker/own_data_overlay.py writes for the worked example's
clients (so the committed overlay and the generator a user runs never drift), and the
generator names every entry of a folder, each mounted alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def generate(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "docker" / "own_data_overlay.py"),
                           str(folder)], capture_output=True, text=True, timeout=60)


def test_the_committed_overlay_is_the_generators_output_for_the_example(tmp_path):
    for i in range(8):
        (tmp_path / f"client-{i:02d}").mkdir()
    done = generate(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (REPO / "docker" / "own-data.yaml").read_text()


def test_every_entry_gets_a_service_that_mounts_it_alone(tmp_path):
    (tmp_path / "alpha").mkdir()
    (tmp_path / "beta.csv").write_text("x,label\n1,a\n")
    (tmp_path / "gamma.npz").write_bytes(b"")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "README.txt").write_text("not a client")
    compose = yaml.safe_load(generate(tmp_path).stdout)
    services = compose["services"]
    assert services["client"]["scale"] == 0
    assert "--expected-clients=3" in services["cloud"]["command"]
    own = {k: v for k, v in services.items() if k.startswith("own-")}
    assert sorted(own) == ["own-alpha", "own-beta", "own-gamma"]
    for name, target in (("own-alpha", "/own"), ("own-beta", "/own.csv"),
                         ("own-gamma", "/own.npz")):
        (mount,) = own[name]["volumes"]
        assert mount.endswith(f":{target}:ro")
        assert f"--data={target}" in own[name]["command"]


def test_an_empty_folder_is_one_line_and_exit_2(tmp_path):
    done = generate(tmp_path)
    assert done.returncode == 2 and "no client folders" in done.stderr
