"""A throw-away Ray cluster on this machine (head + worker nodes on 127.0.0.1) for tests and
benchmarks of ``flwr run`` on an existing cluster.

Every node is started with ``ray start`` under a private temp dir and explicit ports, and
stopped by PID: the processes whose command line names that temp dir, their children, and the
``ray start`` process groups, never ``ray stop`` (which stops every Ray node on the machine,
other people's included).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


#: Ray turns ``--node-ip-address 127.0.0.1`` into the machine's outward address (its
#: ``resolve_ip_for_localhost``) unless "cluster mode" is off, which makes it use the loopback
#: address; nodes *and* drivers of this cluster need it (``ray_constants.ENABLE_RAY_CLUSTER``).
#: With cluster mode off, though, ``ray start --address`` refuses to add a worker node, so worker
#: nodes are started through :func:`_loopback_ray_start` (``python -m`` this module), which lets
#: the join through and keeps every address on 127.0.0.1.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_bin() -> str:
    path = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if not Path(path).exists():
        raise FileNotFoundError("the `ray` command is not installed (pip install 'flwr[simulation]')")
    return path


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pids: set[int]) -> set[int]:
    """The PIDs among ``pids`` that are running (not gone, not zombies waiting for a reap)."""
    alive = set()
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "zombie" not in status:
            alive.add(pid)
    return alive


@dataclass
class LocalRayCluster:
    """Ray nodes on 127.0.0.1 with ``cpus_per_node`` CPUs each (see module docstring).

    ``env``: environment of the nodes (default: this process's, plus offline Ray settings).
    """

    cpus_per_node: int = 1
    env: dict[str, str] | None = None
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fcray-")))
    port: int = field(default_factory=free_port)
    nodes: int = 0
    _groups: list[int] = field(default_factory=list)

    @property
    def address(self) -> str:
        """``host:port`` of the head's GCS (what ``RAY_ADDRESS`` holds)."""
        return f"127.0.0.1:{self.port}"

    def _node_env(self) -> dict[str, str]:
        env = dict(self.env if self.env is not None else os.environ)
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env.update(LOOPBACK_ENV)
        env.pop("RAY_ADDRESS", None)
        return env

    def _ports(self) -> list[str]:
        lo = free_port()
        args = ["--node-manager-port", str(free_port()),
                "--object-manager-port", str(free_port()),
                "--metrics-export-port", str(free_port()),
                "--dashboard-agent-listen-port", str(free_port()),
                "--dashboard-agent-grpc-port", str(free_port()),
                "--runtime-env-agent-port", str(free_port())]
        # a private range of worker ports per node (free_port picks from the ephemeral range)
        base = 20000 + (lo % 200) * 100 + self.nodes * 20
        return args + ["--min-worker-port", str(base), "--max-worker-port", str(base + 19)]

    def _start(self, args: list[str], timeout_s: float) -> None:
        _ray_bin()  # a clear error when Ray is not installed
        cmd = [sys.executable, "-m", __name__, "start", "--num-cpus", str(self.cpus_per_node), "--num-gpus", "0",
               "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *self._ports(), *args]
        proc = subprocess.Popen(cmd, env=self._node_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._groups.append(proc.pid)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError(f"`ray start` did not return within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"`ray start` failed ({proc.returncode}): {out[-2000:]}")
        self.nodes += 1

    def start_head(self, timeout_s: float = 180.0, attempts: int = 3) -> None:
        """Start the head node (GCS on ``self.port``). Ray gives a raylet a fixed 30 s to
        register; on a loaded machine that can fail, so a failed start is cleaned up and tried
        again (``attempts`` in all) with fresh ports and temp dir."""
        for attempt in range(1, attempts + 1):
            try:
                self._start(["--head", "--port", str(self.port), "--temp-dir",
                             str(self.temp_dir), "--include-dashboard", "false",
                             "--ray-client-server-port", str(free_port())], timeout_s)
                return
            except RuntimeError as err:
                if attempt == attempts or "timed out during startup" not in str(err):
                    raise
                log.warning("Ray head did not start (attempt %d): raylet registration timed "
                            "out; retrying", attempt)
                self.stop()
                self.temp_dir = Path(tempfile.mkdtemp(prefix="fcray-"))
                self.port = free_port()
                self._groups.clear()

    def add_worker(self, timeout_s: float = 180.0, attempts: int = 3) -> None:
        """Start one more node joining the head (retried like :meth:`start_head`)."""
        for attempt in range(1, attempts + 1):
            try:
                self._start(["--address", self.address], timeout_s)
                return
            except RuntimeError as err:
                if attempt == attempts or "timed out during startup" not in str(err):
                    raise
                log.warning("Ray worker node did not start (attempt %d); retrying", attempt)

    def pids(self) -> set[int]:
        """PIDs of this cluster's processes: those whose command line names its temp dir or
        GCS port, and their descendants (read from /proc)."""
        needles = (str(self.temp_dir), self.address, f"gcs_server_port={self.port}",
                   f"gcs-address={self.address}")
        cmdline: dict[int, str] = {}
        parent: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmdline[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        found = {pid for pid, cmd in cmdline.items() if any(n in cmd for n in needles)}
        grew = True
        while grew:
            kids = {pid for pid, pp in parent.items() if pp in found and pid not in found}
            found |= kids
            grew = bool(kids)
        found.discard(os.getpid())
        return found

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every process of this cluster by PID (TERM, then KILL); remove the temp dir.

        Returns once none of the cluster's processes is alive (zombies of other parents
        aside): a process the raylet spawned while the first ones died is found by a fresh
        scan and killed too, and a killed process is waited for until it has exited."""
        pids = self.pids()
        _signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pids):
            time.sleep(0.2)
        for pgid in self._groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout_s
        while True:
            pids = _alive(pids | self.pids())
            if not pids or time.monotonic() > deadline:
                break
            _signal_all(pids, signal.SIGKILL)
            time.sleep(0.1)
        if pids:
            log.warning("Ray processes %s still alive %.0f s after SIGKILL", sorted(pids),
                        timeout_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _loopback_ray_start(argv: list[str]) -> None:
    """``ray start`` for a node of a loopback-only cluster.

    Ray refuses to start a worker node while cluster mode is off (its check is meant for macOS
    and Windows), yet cluster mode on would resolve 127.0.0.1 to the outward address. So this
    process turns cluster mode on for that one check and answers 127.0.0.1 wherever ``ray start``
    asks for this node's address; the processes it spawns inherit :data:`LOOPBACK_ENV` and stay
    on loopback by themselves.
    """
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray.scripts.scripts import main

    ray_constants.ENABLE_RAY_CLUSTER = True
    services.get_node_ip_address = lambda address=None: "127.0.0.1"
    sys.argv = ["ray", *argv]
    main()


__all__ = ["LOOPBACK_ENV", "LocalRayCluster", "free_port"]

if __name__ == "__main__":
    _loopback_ray_start(sys.argv[1:])
