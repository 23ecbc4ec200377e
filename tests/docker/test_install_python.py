"""docker/install-python.sh shows why apt failed (runs without Docker: a fake apt-get)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "install-python.sh"


def test_a_failing_apt_step_prints_its_last_lines_and_exit_code(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text("#!/bin/sh\n[ \"$1\" = update ] && exit 0\n"
                   "echo 'E: Failed to fetch http://deb.debian.org/debian/pool/main/p/"
                   "python3.11/libpython3.11-stdlib.deb  Connection reset by peer'\nexit 100\n")
    apt.chmod(0o755)
    for tool in ("tail", "rm", "cat"):  # no python3 on PATH: the script must install it
        os.symlink(shutil.which(tool), bin_dir / tool)
    done = subprocess.run(["/bin/sh", str(SCRIPT)], env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 100
    lines = done.stderr.splitlines()
    assert lines[0] == ("install-python.sh: 'apt-get install -y --no-install-recommends python3 "
                        "python3-venv' failed (exit 100); its last lines:")
    assert "Connection reset by peer" in lines[1]
