"""Child processes of the deployment roles: start, watch, and stop them (and theirs) by PID.

Flower's ``flower-superlink``/``flower-supernode`` start a ``flower-superexec`` in a new session,
which starts one ``flwr-serverapp``/``flwr-clientapp`` process per run or message; a process
group kill does not reach them. :class:`Child` therefore records a process's descendants
(walking ``/proc``: the threads' children lists, else every parent PID) before it stops the
process, and then stops whichever of those PIDs are still alive: first SIGTERM, then SIGKILL
after a grace period. Nothing is ever killed by name.

Also here: free loopback ports, port checks, and the offline-safe environment every Flower
process of FedCure runs with, whose ``PATH`` starts with this Python's scripts directory
(:func:`scripts_dirs`): a role started by full path from a virtual environment that is not on
``PATH`` still runs that environment's Flower, including the executables Flower itself starts by
name (``flower-superexec``, ``flwr-serverapp``, ``flwr-clientapp``).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

#: Environment for every Flower process FedCure starts: no telemetry, no update check, no
#: runtime dependency installation (``uv sync`` needs the network), fast SuperExec task polls.
FLOWER_OFFLINE_ENV: dict[str, str] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}


def scripts_dirs() -> list[str]:
    """Where this Python's console scripts live: the install scheme's scripts directory and
    the running interpreter's own directory (a virtual environment's ``bin``, not resolved
    through its symlink), each once, existing ones only."""
    out: list[str] = []
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if d and os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def script_path(name: str) -> str:
    """The console script ``name`` in :func:`scripts_dirs`, else ``name`` (looked up on PATH)."""
    for d in scripts_dirs():
        here = os.path.join(d, name)
        if os.path.isfile(here) and os.access(here, os.X_OK):
            return here
    return name


def path_with_scripts(path: str | None) -> str:
    """The ``PATH`` value ``path`` with :func:`scripts_dirs` put first (each once)."""
    first = scripts_dirs()
    rest = [d for d in (path or "").split(os.pathsep) if d and d not in first]
    return os.pathsep.join(first + rest)


def flower_env(flwr_home: str | Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus :data:`FLOWER_OFFLINE_ENV`, a private ``FLWR_HOME`` and
    a ``PATH`` that starts with this Python's scripts directory (:func:`path_with_scripts`)."""
    env = dict(os.environ)
    env.update(FLOWER_OFFLINE_ENV)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = path_with_scripts(env.get("PATH"))
    if extra:
        env.update(extra)
    return env


def release_memory() -> None:
    """Collect garbage and hand the C heap's free pages back to the kernel (glibc's
    ``malloc_trim``; a no-op elsewhere): for long-lived client processes after their one-off
    loading, so that their resident memory is what they keep, not what they once needed."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


# ----------------------------------------------------------------------------------- ports
def quiet_grpc() -> None:
    """Silence gRPC core's own stderr lines (bind errors and the like, which FedCure reports
    itself) unless ``GRPC_VERBOSITY`` asks for DEBUG/INFO; call before grpc is imported."""
    if os.environ.get("GRPC_VERBOSITY", "").upper() not in ("DEBUG", "INFO"):
        os.environ["GRPC_VERBOSITY"] = "NONE"


def role_start(quiet: bool, role_log: logging.Logger) -> threading.Event:
    """Start-up shared by the role commands: timestamped logging (warnings only when
    ``quiet``) and an event set on SIGTERM/SIGINT, which the role polls to stop cleanly."""
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        role_log.info("%s received: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def split_address(address: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) split and checked; ``ValueError`` with one line."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:9092), got {address!r}")
    return host, int(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read, close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports on ``host`` (held open together while choosing)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                              socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def check_bindable(host: str, port: int, what: str) -> None:
    """Raise ``OSError`` with one plain line when ``host:port`` cannot be listened on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            reason = "the port is already in use" if err.errno == 98 else (err.strerror or err)
            raise OSError(f"cannot listen on {host}:{port} ({what}): {reason}") from None


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------------------- /proc
def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid`` from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    return int(rest[1]), rest[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is not a zombie)."""
    st = _stat(pid)
    if st is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not Path("/proc").is_dir()
    return st[1] not in ("Z", "X")


def wait_gone(pid: int, poll_s: float = 0.5) -> None:
    """Block until process ``pid`` has exited (or is a zombie). On Linux it sleeps on a pidfd,
    which wakes only when the process exits; elsewhere (or without the right to open one) it
    looks every ``poll_s`` seconds. A watcher of its parent thus costs nothing while it waits."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is gone already
        while alive(pid):
            time.sleep(poll_s)
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll(None):
            pass
    finally:
        os.close(fd)


def _children(pid: int) -> list[int] | None:
    """The live children of ``pid`` from its threads' ``/proc/PID/task/TID/children`` files
    (a child is listed under the thread that forked it); None where the kernel has no such
    files (``CONFIG_PROC_CHILDREN``). [] when ``pid`` is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    except OSError:
        return None
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.isdir(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            return None
    return [c for c in out if alive(c)]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first, then theirs), via /proc: by walking
    the threads' children lists (a few reads per process of the tree), else by reading every
    process's parent (one read per process on the host: milliseconds with a few hundred)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        found = _children(todo.pop(0))
        if found is None:
            return _descendants_by_scan(pid)
        for c in found:
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _descendants_by_scan(pid: int) -> list[int]:
    """:func:`descendants` from every process's parent PID (kernels without children lists)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is not None and st[1] not in ("Z", "X"):
            children.setdefault(st[0], []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        for c in children.get(p, []):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def stop_pids(pids: Sequence[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM each live pid, wait up to ``grace_s``, SIGKILL the rest; return those killed."""
    live = [p for p in pids if alive(p)]
    for p in live:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(alive(p) for p in live):
        time.sleep(0.05)
    killed = []
    for p in live:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
                killed.append(p)
            except ProcessLookupError:
                pass
    return killed


# ----------------------------------------------------------------------------------- children
class Child:
    """One started process, its log file, and everything it started.

    ``stop()`` SIGTERMs the process, waits ``grace_s``, SIGKILLs it if needed, then stops every
    descendant seen before or during (by PID). The descendant list is refreshed by
    :meth:`remember_descendants`, which :meth:`poll` calls at most every
    :attr:`descendants_every_s` seconds (each refresh reads every process's /proc entry, and the
    roles poll their children twice a second: unthrottled, those scans took more CPU than the
    clients' training in a deployed edge round on a busy host) and :meth:`stop` calls first.
    ``pass_fds``: file descriptors the process inherits (e.g. a listening socket).
    """

    #: least seconds between two descendant scans from :meth:`poll`
    descendants_every_s = 2.0

    def __init__(self, name: str, argv: Sequence[str], *, log_path: str | Path | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 new_session: bool = True, on_line: Callable[[str], None] | None = None,
                 pass_fds: Sequence[int] = ()) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path) if log_path is not None else None
        self._log: IO[str] | None = None
        self._seen: set[int] = set()
        self._scanned_at = -float("inf")
        self._pump: threading.Thread | None = None
        stdout: int | IO[str] = subprocess.DEVNULL
        if on_line is not None:
            stdout = subprocess.PIPE
        elif self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", buffering=1)  # noqa: SIM115
            stdout = self._log
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=stdout, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                cwd=str(cwd) if cwd is not None else None, start_new_session=new_session,
                text=True, pass_fds=tuple(pass_fds),
            )
        except FileNotFoundError:
            if self._log is not None:
                self._log.close()
            raise FileNotFoundError(
                f"cannot start {name}: command {self.argv[0]!r} not found "
                "(is the package installed in this environment?)") from None
        if on_line is not None:
            self._pump = threading.Thread(target=self._pump_lines, args=(on_line,),
                                          name=f"{name}-log", daemon=True)
            self._pump.start()
        log.debug("started %s (pid %d): %s", name, self.proc.pid, " ".join(self.argv))

    def _pump_lines(self, on_line: Callable[[str], None]) -> None:
        assert self.proc.stdout is not None
        sink = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = open(self.log_path, "a", buffering=1)  # noqa: SIM115
        try:
            for line in self.proc.stdout:
                if sink is not None:
                    sink.write(line)
                on_line(line.rstrip("\n"))
        finally:
            if sink is not None:
                sink.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code, or None while it runs (and remember its descendants)."""
        code = self.proc.poll()
        if code is None and time.monotonic() - self._scanned_at >= self.descendants_every_s:
            self.remember_descendants()
        return code

    def remember_descendants(self) -> None:
        self._scanned_at = time.monotonic()
        self._seen.update(descendants(self.proc.pid))

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log (for error messages)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace_s: float = 5.0) -> int | None:
        """Stop it and everything it started; return its exit code."""
        if self.proc.poll() is None:
            self.remember_descendants()
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it", self.name,
                            self.proc.pid, grace_s)
                self.proc.kill()
                self.proc.wait(5)
        left = [p for p in self._seen if alive(p)]
        if left:
            # descendants of the descendants may have appeared meanwhile
            for p in list(left):
                left.extend(d for d in descendants(p) if d not in left)
            killed = stop_pids(left, grace_s=min(grace_s, 3.0))
            if killed:
                log.debug("%s: killed leftover processes %s", self.name, killed)
        if self._pump is not None:
            self._pump.join(2)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for it to exit on its own (None on timeout), remembering descendants."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(0.1)
        return self.proc.returncode


__all__ = ["Child", "FLOWER_OFFLINE_ENV", "alive", "check_bindable", "descendants",
           "flower_env", "free_port", "free_ports", "path_with_scripts", "port_open",
           "script_path", "scripts_dirs", "split_address", "stop_pids", "wait_gone"]
