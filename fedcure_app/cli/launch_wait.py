"""``fedcure launch``'s wait: the cloud's ``Monitor.Status`` polled, the roles watched until the
run is over (:func:`supervise`), and the one-line progress it shows meanwhile."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("fedcure_app.cli.launch")


def _check_running(child: Any) -> None:
    """RuntimeError, with the end of its log, when ``child`` exited while starting."""
    if child.poll() is not None:
        raise RuntimeError(f"{child.name} exited with code {child.proc.returncode} at start;"
                           f" its log ends with:\n{child.tail()}")


def wait_listening(child: Any, site: Any, host: str, port: int,
                    timeout_s: float = 120.0) -> None:
    """Wait until ``child`` listens on ``host:port`` (as ``site`` reaches it); RuntimeError when
    it exits first or does not listen within ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        _check_running(child)
        if site.port_open(child.name, host, port):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{child.name} did not listen on {host}:{port} within {timeout_s:.0f} s")


def wait_edge_ready(child: Any, site: Any, host: str, port: int, started: Path,
                    timeout_s: float = 300.0) -> None:
    """Wait until edge ``child`` serves its SuperLink on ``host:port`` and its edge ServerApp
    has started (its log file ``started`` exists); RuntimeError when the edge exits first or
    is not ready within ``timeout_s``. The launch starts clients only then: dozens of clients
    starting at once take the CPU for minutes on a small machine, and the edge's own start-up
    (SuperLink, ``flwr run``, ServerApp) has limits of its own."""
    end = time.monotonic() + timeout_s
    wait_listening(child, site, host, port, timeout_s)
    while time.monotonic() < end:
        _check_running(child)
        if started.is_file():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{child.name}'s edge ServerApp did not start within {timeout_s:.0f} s")


class StatusPoller:
    """The cloud's ``Monitor.Status`` (None while unreachable)."""

    def __init__(self, address: str, tls_dir: str | None) -> None:
        from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
        from fedcure_app.protocol.channel import open_channel

        if tls_dir:
            self.channel = open_channel(address, tls_ca=str(Path(tls_dir) / "ca.crt"))
        else:
            logging.getLogger("fedcure.channel").setLevel(logging.ERROR)
            self.channel = open_channel(address, insecure=True)
        self.stub = pb_grpc.MonitorStub(self.channel)

    def __call__(self) -> Any:
        import grpc

        from fedcure_app.protocol import cloud_pb2 as pb

        try:
            return self.stub.Status(pb.StatusRequest(), timeout=2.0)
        except grpc.RpcError:
            return None

    def close(self) -> None:
        self.channel.close()


def report_refused(child: Any, reported: set[str]) -> None:
    """Log once, in one line, why a client exited with code 2 (its data, model or flags were
    refused: the last line of its log), by the client's name (its ``client_name``, else the
    process's); the run goes on with the others."""
    if child.poll() != 2 or child.name in reported:
        return
    reported.add(child.name)
    last = (child.tail(1) or "no reason logged").strip()
    log.warning("%s refused: %s", getattr(child, "client_name", child.name),
                last.removeprefix("fedcure-client: error: "))


def last_error(child: Any) -> str:
    """The ``PROG: error: WHY`` line a role printed last (its WHY), or ``""``."""
    lines = [ln.strip() for ln in (child.tail(20) or "").splitlines() if ": error: " in ln]
    return lines[-1].split(": error: ", 1)[1] if lines else ""


def supervise(roles: Any, status: StatusPoller, rounds: int, args: argparse.Namespace,
              stop: threading.Event, result_path: Path | None = None,
              exit_grace_s: float = 120.0) -> tuple[int, str]:
    """Wait for the cloud to finish; return (exit code, reason).

    An edge that exits with an error is logged once and the others train on (the cloud takes
    its coalition out at the task's deadline); the launch fails when the cloud fails or every
    edge has.

    A cloud that reported DONE and wrote ``result_path`` but has not exited ``exit_grace_s``
    later is stopped (and the run counts as done). The grace covers the cloud's last writes
    after ``result.json`` (the plots; the model's ``torch.export`` precedes it and takes tens
    of seconds on a loaded host)."""
    from rich.console import Console
    from rich.progress import Progress, TextColumn

    from fedcure_app.protocol import cloud_pb2 as pb

    t0 = time.monotonic()
    console = Console(stderr=True)
    with Progress(TextColumn("{task.fields[line]}", markup=False), console=console,
                  disable=args.no_progress, transient=False) as progress:
        bar = progress.add_task("launch", total=rounds, line=progress_line(
            "starting", 0, rounds, "", 0.0, console.width))
        done_at: float | None = None
        reported: set[str] = set()
        failed: dict[str, str] = {}  # edges that exited with an error: their coalitions lost
        while not stop.is_set():
            code = roles.cloud.poll()
            if code is not None:
                why = "" if code == 0 else last_error(roles.cloud)
                lost = f" ({'; '.join(failed.values())})" if failed else ""
                return (0, "done" + lost) if code == 0 else (
                    code, f"the cloud exited with code {code}" + (f": {why}" if why else ""))
            for child in roles.edges:
                if child.name not in failed and child.poll() not in (None, 0):
                    why = last_error(child)
                    failed[child.name] = (f"{child.name} exited with code "
                                          f"{child.proc.returncode}" + (f": {why}" if why else ""))
                    if len(failed) == len(roles.edges):  # no coalition can train any more
                        return 1, "; ".join(failed.values())
                    log.warning("%s; its coalition is lost at its task's deadline, the others "
                                "train on", failed[child.name])
            for child in roles.clients:
                report_refused(child, reported)
            s = status()
            if s is not None and s.phase == pb.StatusReply.DONE and done_at is None:
                done_at = time.monotonic()
            if (done_at is not None and time.monotonic() - done_at > exit_grace_s
                    and result_path is not None and result_path.is_file()):
                log.warning("the cloud finished but did not exit within %.0f s; stopping it",
                            exit_grace_s)
                roles.cloud.stop()
                return 0, "done (cloud stopped after it finished)"
            if s is not None:
                edges_done = sum(1 for c in roles.edges if c.proc.poll() == 0)
                done = min(s.round, rounds)
                progress.update(bar, completed=done, line=progress_line(
                    phase_label(s), done, rounds, status_text(s, edges_done),
                    time.monotonic() - t0, console.width))
            if args.timeout and time.monotonic() - t0 > args.timeout:
                return 1, f"timed out after {args.timeout:.0f} s"
            stop.wait(0.5)
    return 130, "interrupted"


def phase_label(s: Any) -> str:
    """The phase of one ``Monitor.Status`` reply in words: ``registering``, ``waiting for
    edges`` (training has begun at the cloud but no edge server has connected yet),
    ``training`` or ``done``."""
    from fedcure_app.protocol import cloud_pb2 as pb

    if s.phase == pb.StatusReply.TRAINING:
        return "waiting for edges" if s.edges_connected == 0 else "training"
    return {pb.StatusReply.REGISTERING: "registering",
            pb.StatusReply.DONE: "done"}.get(s.phase, "starting")


def progress_line(phase: str, done: int, total: int, detail: str, elapsed_s: float,
                  width: int) -> str:
    """One progress line at most ``width - 1`` characters (the terminal's last column makes
    some terminals wrap): ``phase round done/total``, a bar when there is room, ``detail`` cut
    at its end with ``…`` when it does not fit, and the elapsed time ``H:MM:SS`` (whole seconds).
    The phase, the round and the elapsed time are never cut."""
    secs = int(max(0.0, elapsed_s))
    clock = f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    head = f"{phase} round {done}/{total}"
    room = max(0, width - 1) - len(head) - len(clock) - 2
    bar_w = min(20, room - len(detail) - 1) if total > 0 else 0
    if bar_w >= 6:
        filled = round(bar_w * min(done, total) / total)
        head += " " + "━" * filled + "─" * (bar_w - filled)
        room -= bar_w + 1
    if len(detail) > room:
        detail = detail[:max(0, room - 1)] + "…" if room > 0 else ""
    return " ".join(x for x in (head, detail, clock) if x)


def status_text(s: Any, edges_done: int = 0) -> str:
    """The progress bar's detail for one ``Monitor.Status`` reply: while registering, clients
    registered and edges connected; while training, edges connected and each coalition's edge
    round (:func:`progress_text`); once done, the edges that have finished (``edges_done``:
    edge processes that exited with code 0; an edge leaves the cloud when it is done)."""
    from fedcure_app.protocol import cloud_pb2 as pb

    edges = f"{s.edges_connected}/{s.num_edges} edges connected"
    if s.phase == pb.StatusReply.REGISTERING:
        return f"{s.clients_registered}/{s.expected_clients} clients, {edges}"
    if s.phase == pb.StatusReply.DONE:
        done = max(edges_done, s.num_edges - s.edges_connected)
        return f"{min(done, s.num_edges)}/{s.num_edges} edges done"
    return edges + (f" · {progress_text(s.progress)}" if s.progress else "")


def progress_text(progress: Any) -> str:
    """``Monitor.Status``'s per-coalition progress in short: ``c0 e4/12 wait[3,5] ~40s`` (edge
    round being trained of τ_e, clients still training, ETA in seconds), ``|``-separated."""
    parts = []
    for p in progress:
        wait = ",".join(str(c) for c in p.training_client_ids)
        step = (f"e{p.edge_round + 1}/{p.tau_e}" if p.edge_round < p.tau_e
                else f"e{p.tau_e}/{p.tau_e} done")
        parts.append(f"c{p.coalition} {step}" + (f" wait[{wait}]" if wait else "")
                     + f" ~{p.eta_s:.0f}s")
    return " | ".join(parts)
