"""A role started by the full path of its console script, from an environment that is not on
PATH: the edge's SuperLink starts ``flower-superexec`` and that one ``flwr-serverapp`` by name,
so they must be found through the PATH FedCure hands its children
(:func:`fedcure_app.runtime.processes.flower_env`), not the caller's."""

from __future__ import annotations

import os
import shutil
import sysconfig
import time
from pathlib import Path

from fedcure_app.runtime.processes import Child, free_port
from tests.deployment.fakes import make_cfg, start_cloud

BARE_PATH = "/usr/bin:/bin"


def test_an_edge_started_by_full_path_without_its_scripts_on_path_connects(cleanup, tmp_path):
    scripts = sysconfig.get_path("scripts")
    assert shutil.which("flower-superexec", path=BARE_PATH) is None  # else this proves nothing
    exe = Path(scripts) / "fedcure-edge"
    server = start_cloud(make_cfg(2, 1), expected=2)
    cleanup.append(server)
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    env["PATH"] = BARE_PATH
    edge = Child("edge", [str(exe), "--cloud", server.address, "--edge-id", "0", "--listen",
                          f"127.0.0.1:{free_port()}", "--work-dir", str(tmp_path / "edge"),
                          "--insecure"], log_path=tmp_path / "edge.log", env=env)
    try:
        roster = server.service.controller.roster
        end = time.monotonic() + 120
        # the edge ServerApp (flwr-serverapp, started by flower-superexec, started by the
        # SuperLink) opens the Connect stream: all three were found
        while 0 not in roster.connected and edge.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        log = (tmp_path / "edge.log").read_text(errors="replace")
        assert 0 in roster.connected, log[-3000:]
        assert edge.poll() is None
        assert "FileNotFoundError" not in log
    finally:
        edge.stop(grace_s=5.0)
