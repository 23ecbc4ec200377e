"""A live testbed federation in a test's hands (root): ``fedcure testbed``'s own code makes the
namespaces and starts the roles (:class:`~fedcure_app.cli.testbed.NamespaceSite`,
:func:`~fedcure_app.cli.launch.start_roles`), then the test cuts and heals links, kills and
restarts the cloud, and watches the cloud's log for aggregations. :meth:`Federation.close`
removes every process, namespace and cgroup it made, also when the test fails."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the cloud's log line of one aggregation (cloud_server.runloop)
ARRIVED = re.compile(r"round (\d+)/\d+: coalition (\d+) arrived( LATE)?")
#: an edge's log line of one answered task (edge_server.serve)
ANSWERED = re.compile(r"edge (\d+): task (\S+) done in [^\n]*-> ([^\n]*)")


@dataclass(frozen=True)
class Arrival:
    """One aggregation as the cloud logged it."""

    round: int
    coalition: int
    late: bool


class Federation:
    """Cloud, edges and clients of one testbed run, started by :meth:`start` (``options``:
    ``fedcure testbed``'s command line after ``--out`` and ``--prefix``)."""

    def __init__(self, out: Path, options: list[str], base: str = "tbpart") -> None:
        self.out = out
        self.options = options
        self.base = base
        self.site: Any = None
        self.roles: Any = None
        self.status: Any = None
        self.cfg: Any = None
        self.record: dict[str, Any] = {}
        self.cloud_argv: list[str] = []
        #: scenario -> seconds from healing to the next aggregation (what the test measured)
        self.recovery: dict[str, float] = {}

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        from fedcure_app.cli import launch, testbed
        from fedcure_app.testbed import netns

        parser = argparse.ArgumentParser()
        testbed.register(parser.add_subparsers())
        args = parser.parse_args(["testbed", "--out", str(self.out), "--prefix", self.base,
                                  *self.options])
        cfg = launch.config_from_args(args)
        launch.check_inputs(args, cfg)
        netns.clean_leftovers(self.base)
        self.out.mkdir(parents=True, exist_ok=True)
        self.site = testbed.NamespaceSite(args)
        self.roles = launch.Roles()
        self.cfg = self.site.setup(cfg, self.out)
        self.record = launch.start_roles(self.cfg, args, self.out, self.roles, self.site)
        self.cloud_argv = list(self.roles.cloud.argv)
        self.status = self.site.status_poller(self.record["cloud"], None)

    def close(self) -> None:
        """Stop every role, remove the namespaces and cgroups (raises nothing)."""
        if self.status is not None:
            self.status.close()
        if self.roles is not None:
            self.roles.stop(grace_s=5.0)
        if self.site is not None:
            self.site.teardown()

    @property
    def plan(self) -> Any:
        return self.site.plan

    @property
    def prefix(self) -> str:
        return self.site.prefix

    # ------------------------------------------------------------------ the cloud
    def kill_cloud(self) -> None:
        """SIGKILL the cloud (its checkpoint is what survives)."""
        self.roles.cloud.proc.send_signal(signal.SIGKILL)
        self.roles.cloud.proc.wait(30)

    def restart_cloud(self) -> None:
        """Start the cloud again with ``--resume`` at the same address; returns once it
        listens."""
        from fedcure_app.cli.launch import _wait_listening
        from fedcure_app.runtime.processes import Child

        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   GRPC_VERBOSITY=os.environ.get("GRPC_VERBOSITY", "NONE"))
        self.roles.cloud = Child("cloud", [*self.cloud_argv, "--resume"],
                                 log_path=self.out / "logs" / "cloud.log", env=env)
        host, port = self.record["cloud"].rsplit(":", 1)
        _wait_listening(self.roles.cloud, self.site, host, int(port))

    def stop_cloud(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """SIGTERM the cloud (it writes its partial results) and return ``result.json``."""
        self.roles.cloud.proc.terminate()
        code = self.roles.cloud.proc.wait(timeout_s)
        assert code == 0, f"the cloud exited with {code} on SIGTERM:\n{self.roles.cloud.tail()}"
        return json.loads((self.out / "result.json").read_text())

    # ------------------------------------------------------------------ the clients
    @contextmanager
    def paused(self, clients: Iterable[int]) -> Iterator[None]:
        """SIGSTOP every process in the namespaces of ``clients`` (their SuperNodes and
        ClientApps) and SIGCONT them on leaving: an edge round of theirs cannot end while the
        test acts, however fast the rounds are. Keep it well within the edge timeout, or the
        edge drops them."""
        from fedcure_app.testbed import netns

        pids = [p for i in clients for p in netns.namespace_pids(self.plan.clients[i].netns)]
        assert pids, f"no process runs in the namespaces of clients {list(clients)}"
        stopped = []
        try:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                stopped.append(pid)
            yield
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    # ------------------------------------------------------------------ watching
    def log(self, role: str) -> str:
        try:
            return (self.out / "logs" / f"{role}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def arrivals(self) -> list[Arrival]:
        """Every aggregation the cloud (and the clouds before it) logged, in order."""
        return [Arrival(int(r), int(c), bool(late))
                for r, c, late in ARRIVED.findall(self.log("cloud"))]

    def answered(self, edge: int) -> list[tuple[str, str]]:
        """(task id, what the cloud answered) for every task edge ``edge`` logged as done."""
        return [(t, reply) for m, t, reply in ANSWERED.findall(self.log(f"edge{edge}"))
                if int(m) == edge]

    def progress(self) -> str:
        """What ``fedcure testbed``'s progress line shows now (``-`` while the cloud does not
        answer)."""
        from fedcure_app.cli.launch import status_text
        from fedcure_app.protocol import cloud_pb2 as pb

        s = self.status()
        if s is None:
            return "- (the cloud does not answer)"
        phase = {pb.StatusReply.TRAINING: "training", pb.StatusReply.DONE: "done"}.get(
            s.phase, "registering")
        return f"{phase} round {s.round}: {status_text(s)}"

    def check_alive(self) -> None:
        """Fail when any role process has exited (no role may need a hand restart)."""
        for child in self.roles.all():
            code = child.poll()
            assert code is None, f"{child.name} exited with code {code}:\n{child.tail()}"

    def wait(self, what: str, ready: Callable[[], bool], timeout_s: float,
             poll_s: float = 0.1, alive: bool = True) -> float:
        """Poll ``ready`` until true; the monotonic time it first was. Fails after
        ``timeout_s`` or, with ``alive``, as soon as a role exits."""
        end = time.monotonic() + timeout_s
        while True:
            if ready():
                return time.monotonic()
            if alive:
                self.check_alive()
            assert time.monotonic() < end, (
                f"waited {timeout_s:.0f} s for {what}; cloud log ends with:\n"
                + "\n".join(self.log("cloud").splitlines()[-15:]))
            time.sleep(poll_s)

    def wait_arrival(self, what: str, after: int, timeout_s: float,
                     match: Callable[[Arrival], bool] = lambda a: True) -> tuple[float, Arrival]:
        """Wait for an aggregation past the first ``after`` that ``match`` accepts; (the
        monotonic time it was seen, it)."""
        found: list[Arrival] = []

        def ready() -> bool:
            found[:] = [a for a in self.arrivals()[after:] if match(a)]
            return bool(found)

        return self.wait(what, ready, timeout_s), found[0]


def say(text: str) -> None:
    """One line of the test's own account (shown with ``pytest -s``; kept in the log)."""
    print(f"[partitions {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


__all__ = ["ANSWERED", "ARRIVED", "Arrival", "Federation", "say"]
