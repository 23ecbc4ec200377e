"""What root-only tests need from this kernel (cgroup CPU control, network namespaces, tc).

Each ``require_*`` returns what it found or skips the test saying why; under
``FEDCURE_TESTBED_TESTS=1`` (set by ``.ci/run``, which runs as root) a missing feature fails
the test instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import os

import pytest


def _missing(why: str) -> None:
    if os.environ.get("FEDCURE_TESTBED_TESTS") == "1":
        pytest.fail(f"FEDCURE_TESTBED_TESTS=1 but {why}")
    pytest.skip(why)


def require_cgroup():
    """The writable CPU cgroup controller (root only)."""
    from fedcure_app.devices.cgroup import CgroupError, find_cpu_controller

    if os.geteuid() != 0:
        _missing("needs root (cgroup CPU control)")
    try:
        return find_cpu_controller()
    except CgroupError as err:
        _missing(f"no writable cgroup CPU controller: {err.strerror or err}")


def require_netns() -> None:
    """Root, ``ip`` with network namespaces and veths, ``tc`` with tbf."""
    from fedcure_app.testbed.netns import kernel_problem

    if os.geteuid() != 0:
        _missing("needs root (network namespaces)")
    problem = kernel_problem()
    if problem:
        _missing(problem)


def mount_tmpfs(path, size: str) -> None:
    """Mount a tmpfs of ``size`` (as ``mount -o size=``, e.g. ``1m``) on ``path`` (root only;
    the caller unmounts it)."""
    import subprocess
    from pathlib import Path

    if os.geteuid() != 0:
        _missing("needs root (mounts a small tmpfs to fill a disk)")
    Path(path).mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        _missing(f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}")
