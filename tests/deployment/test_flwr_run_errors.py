"""`flwr run`'s own reason reaches the user when it refuses an edge's run."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

import edge_server.superlink as superlink


def _fake_flwr(tmp_path: Path, answer: dict, code: int = 0) -> Path:
    script = tmp_path / "flwr"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"print(json.dumps({answer!r}, indent=2))\nsys.exit({code})\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_a_refused_run_says_flwrs_error_message(tmp_path, monkeypatch):
    fake = _fake_flwr(tmp_path, {"success": False,
                                 "error-message": "\nNo module named 'edge_server'"})
    monkeypatch.setattr(superlink, "flower_bin", lambda name: str(fake))
    with pytest.raises(superlink.SuperLinkError,
                       match=r"failed \(code 0\): No module named 'edge_server'$"):
        superlink.submit_run(tmp_path, tmp_path)
    assert json.loads((tmp_path / "flwr-run.log").read_text())["success"] is False


def test_an_accepted_run_gives_its_run_id(tmp_path, monkeypatch):
    fake = _fake_flwr(tmp_path, {"success": True, "run-id": 1234567890})
    monkeypatch.setattr(superlink, "flower_bin", lambda name: str(fake))
    assert superlink.submit_run(tmp_path, tmp_path) == 1234567890
