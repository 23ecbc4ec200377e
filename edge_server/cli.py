"""``fedcure-edge``: one edge server (ES) of a FedCure deployment.

    fedcure-edge --cloud HOST:PORT --edge-id M --listen HOST:PORT [--advertise HOST:PORT] \\
        [--token T] [--insecure] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] \\
        [--work-dir DIR]

Starts a Flower SuperLink whose Fleet API serves ``--listen`` (where this ES's clients connect
their SuperNodes), and submits the FedCure ServerApp to it (``role = "edge"``). That ServerApp
connects to the cloud at ``--cloud`` as edge ``M``, telling it ``--advertise`` (default
``--listen`` with 0.0.0.0 read as 127.0.0.1) as the address for its clients, and serves the
cloud's tasks (τ_e FedAvg rounds over its coalition) until training is over. Exits 0 then, and on
SIGTERM/SIGINT, stopping the SuperLink and everything it started.

Security: ``--insecure`` runs plaintext everywhere (local tests). Otherwise ``--tls-cert``/
``--tls-key`` (with ``--tls-ca``, the CA that signed them) serve the SuperLink over TLS, and the
cloud is reached over TLS verified with ``--tls-ca`` (``--cloud-cert``/``--cloud-key`` add a
client certificate for mutual TLS). ``--token`` (default ``$FEDCURE_TOKEN``) is the cloud's
shared secret.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fedcure_app.errors import UsageError

PROG = "fedcure-edge"
log = logging.getLogger("fedcure.edge")


def build_parser() -> argparse.ArgumentParser:
    from fedcure_app.errors import ArgumentParser, HelpFormatter

    p = ArgumentParser(prog=PROG, description="FedCure edge server: a Flower SuperLink "
                                "for its clients plus the edge ServerApp linked to the cloud.",
                                formatter_class=HelpFormatter)
    p.add_argument("--cloud", required=True, metavar="HOST:PORT", help="the cloud's address")
    p.add_argument("--edge-id", required=True, type=int, metavar="M",
                   help="this edge's id (coalition index 0..M-1)")
    p.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="Flower Fleet API address for this edge's SuperNodes, e.g. 0.0.0.0:9092")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="address the cloud gives to clients (default: --listen, 0.0.0.0 -> "
                        "127.0.0.1)")
    p.add_argument("--token", default=os.environ.get("FEDCURE_TOKEN", ""),
                   help="the cloud's shared secret (default $FEDCURE_TOKEN)")
    sec = p.add_argument_group("transport security (see `fedcure certs`)")
    sec.add_argument("--insecure", action="store_true",
                     help="plaintext to the cloud and for the SuperLink (local testing only)")
    sec.add_argument("--tls-ca", metavar="FILE",
                     help="CA (PEM) that verifies the cloud and signed --tls-cert")
    sec.add_argument("--tls-cert", metavar="FILE", help="the SuperLink's server certificate")
    sec.add_argument("--tls-key", metavar="FILE", help="the SuperLink's server private key")
    sec.add_argument("--cloud-cert", metavar="FILE",
                     help="client certificate for mutual TLS with the cloud")
    sec.add_argument("--cloud-key", metavar="FILE", help="its private key")
    sec.add_argument("--supernode-auth", action="store_true",
                     help="admit only the SuperNodes of the clients the cloud assigned here "
                          "(Flower SuperNode authentication; needs TLS)")
    p.add_argument("--work-dir", metavar="DIR",
                   help="where the SuperLink's home, logs and the generated app go "
                        "(default: a fresh temporary folder)")
    p.add_argument("--connect-timeout", type=float, default=60.0, metavar="S",
                   help="how long to wait for the cloud to answer at start (default 60)")
    p.add_argument("--discovery-timeout", type=float, default=300.0, metavar="S",
                   help="how long a task waits for its clients' SuperNodes (default 300)")
    p.add_argument("--edge-timeout", type=float, default=0.0, metavar="S",
                   help="per edge round reply deadline; slower clients are dropped (0: wait)")
    p.add_argument("--reconnect-timeout", type=float, default=300.0, metavar="S",
                   help="how long to keep reconnecting (and re-submitting a finished task) to "
                        "a cloud that stopped answering before giving up: the longest "
                        "partition or cloud restart this edge rides out (default 300)")
    p.add_argument("--reply-poll", type=float, metavar="S", default=None,
                   help="seconds between the edge's asks for its clients' replies; each is a "
                        "request to its SuperLink (default 0.01, or $FEDCURE_EDGE_REPLY_POLL_S; "
                        "0.001-1)")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p


def reply_poll_s(flag: float | None, env: Any) -> float:
    """Seconds between reply pulls: ``--reply-poll``, else ``$FEDCURE_EDGE_REPLY_POLL_S``, else
    0.01; :class:`UsageError` outside 0.001-1."""
    raw: Any = flag if flag is not None else env.get("FEDCURE_EDGE_REPLY_POLL_S") or 0.01
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"FEDCURE_EDGE_REPLY_POLL_S must be seconds, got {raw!r}") from None
    if not 0.001 <= value <= 1.0:
        raise UsageError(f"--reply-poll must be in [0.001, 1] s, got {value}")
    return value


def _check_files(args: argparse.Namespace) -> Any:
    from edge_server.superlink import TLSFiles

    tls_files = [args.tls_ca, args.tls_cert, args.tls_key, args.cloud_cert, args.cloud_key]
    if args.insecure and any(tls_files):
        raise UsageError("--insecure cannot be combined with --tls-* / --cloud-* files")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if (args.cloud_cert is None) != (args.cloud_key is None):
        raise UsageError("--cloud-cert and --cloud-key go together")
    for f in tls_files:
        if f and not Path(f).is_file():
            raise UsageError(f"file not found: {f}")
    if args.insecure:
        return None
    if args.tls_cert is None:
        raise UsageError("the SuperLink needs --tls-cert/--tls-key (and --tls-ca), or "
                         "--insecure for plaintext")
    if args.tls_ca is None:
        raise UsageError("--tls-cert needs --tls-ca (the CA that signed it; the SuperNodes "
                         "verify the SuperLink with it)")
    return TLSFiles(cert=str(Path(args.tls_cert).resolve()),
                    key=str(Path(args.tls_key).resolve()), ca=str(Path(args.tls_ca).resolve()))


def check_cloud(address: str, channel: Any, timeout_s: float, *, insecure: bool | None = None,
                tls_ca: str | None = None) -> None:
    """Wait up to ``timeout_s`` for the cloud to answer ``Monitor.Status``; one-line error.
    With ``insecure`` given, a TLS mismatch is a ``ChannelSecurityError`` within seconds."""
    import grpc

    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.channel import (
        ChannelSecurityError,
        check_security,
        security_mismatch,
    )

    if insecure is not None:
        check_security(channel, address, insecure=insecure, tls_ca=tls_ca, role="edge")
    stub = pb_grpc.MonitorStub(channel)
    try:
        stub.Status(pb.StatusRequest(), timeout=timeout_s, wait_for_ready=True)
    except grpc.RpcError as err:
        code = err.code()
        why = insecure is not None and security_mismatch(address, insecure=insecure,
                                                         tls_ca=tls_ca, role="edge")
        if why:  # the cloud came up late, speaking another security
            raise ChannelSecurityError(why) from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise ConnectionError(f"cannot reach the cloud at {address} within {timeout_s:.0f} s "
                                  "(wrong address, or the cloud is not running)") from None
        raise ConnectionError(f"the cloud at {address} answered {code.name}: "
                              f"{err.details()}") from None


class Tail:
    """Copy new lines of a growing file to a callback (the ServerApp's log to ours)."""

    def __init__(self, path: Path, emit: Any) -> None:
        self.path = path
        self.emit = emit
        self._pos = 0
        self._buf = ""

    def pump(self) -> None:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self._pos)
                data = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return
        self._buf += data
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            if line.strip():
                self.emit(line)


class CloudWatch:
    """Polls the cloud's ``Monitor.Status`` every few seconds: a fallback way to learn that
    training is over when the ServerApp could not say so (it normally does, once the cloud ends
    its task stream). Reports done only after the cloud has said DONE for ``grace_s``."""

    def __init__(self, channel: Any, every_s: float = 3.0, grace_s: float = 20.0) -> None:
        from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc

        self.stub = pb_grpc.MonitorStub(channel)
        self.every_s = every_s
        self.grace_s = grace_s
        self._next = time.monotonic() + every_s
        self._done_since: float | None = None

    def done(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every_s
        import grpc

        from fedcure_app.protocol import cloud_pb2 as pb

        try:
            reply = self.stub.Status(pb.StatusRequest(), timeout=2.0)
        except grpc.RpcError:
            return False
        if reply.phase != pb.StatusReply.DONE:
            self._done_since = None
            return False
        self._done_since = self._done_since or now
        return now - self._done_since >= self.grace_s


def run_edge(args: argparse.Namespace, stop: threading.Event) -> int:
    """Start the SuperLink, submit the edge ServerApp, supervise until done or ``stop``."""
    import json

    from edge_server.serve import open_cloud_channel
    from edge_server.settings import EdgeSettings
    from edge_server.superlink import (
        edge_run_config,
        start_superlink,
        submit_run,
        write_app_dir,
        write_flwr_home,
    )
    from fedcure_app.runtime.processes import check_bindable, split_address

    tls = _check_files(args)
    if args.supernode_auth and tls is None:
        raise UsageError("--supernode-auth needs TLS for the SuperLink (--tls-ca, --tls-cert, "
                         "--tls-key): Flower authenticates SuperNodes only over TLS")
    split_address(args.cloud, "--cloud")
    host, port = split_address(args.listen, "--listen")
    if args.edge_id < 0:
        raise UsageError(f"--edge-id must be >= 0, got {args.edge_id}")
    if not 0 < args.reconnect_timeout < float("inf"):
        raise UsageError(f"--reconnect-timeout must be a number of seconds > 0, got "
                         f"{args.reconnect_timeout}")
    reply_poll = reply_poll_s(args.reply_poll, os.environ)
    advertise = args.advertise or (f"127.0.0.1:{port}" if host in ("0.0.0.0", "::")
                                   else args.listen)
    split_address(advertise, "--advertise")
    check_bindable(host, port, "--listen, the Fleet API for this edge's clients")

    from fedcure_app.runtime.workdir import make_work_dir

    # main() removes a temporary work folder once the SuperLink is stopped
    work, args.temp_work = make_work_dir(args.work_dir, f"fedcure-edge{args.edge_id}-")
    args.work_path = work
    settings = EdgeSettings(
        cloud=args.cloud, edge_id=args.edge_id, advertise=advertise, token=args.token,
        insecure=args.insecure, tls_ca=tls.ca if tls else args.tls_ca,
        cloud_cert=args.cloud_cert, cloud_key=args.cloud_key, parent_pid=os.getpid(),
        log_file=str(work / "serverapp.log"), status_file=str(work / "status.json"),
        discovery_timeout_s=args.discovery_timeout,
        edge_timeout_s=args.edge_timeout if args.edge_timeout > 0 else None,
        poll_s=reply_poll, reconnect_timeout_s=args.reconnect_timeout,
    )
    for name in ("status.json", "serverapp.log"):
        (work / name).unlink(missing_ok=True)
    channel = open_cloud_channel(settings)
    try:
        check_cloud(args.cloud, channel, args.connect_timeout, insecure=args.insecure,
                    tls_ca=args.tls_ca)
    except BaseException:
        channel.close()
        raise
    log.info("edge %d: cloud at %s answers; work dir %s", args.edge_id, args.cloud, work)

    edge_file = settings.save(work / "edge.json")
    local = f"127.0.0.1:{port}" if host in ("0.0.0.0", "::") else f"{host}:{port}"
    write_flwr_home(work / "flwr-home", local, tls)
    app_dir = write_app_dir(work / "app", edge_run_config(edge_file))
    superlink = start_superlink(work, host, port, tls, supernode_auth=args.supernode_auth)
    keys_stop = threading.Event()
    if args.supernode_auth:
        from edge_server.keys import KeyRegistrar
        from edge_server.superlink import CONNECTION
        from fedcure_app.flower.tools import flower_bin
        from fedcure_app.runtime.processes import flower_env

        registrar = KeyRegistrar(channel, args.edge_id, args.token, keys_dir=work / "keys",
                                 connection=CONNECTION, env=flower_env(work / "flwr-home"),
                                 flwr_bin=flower_bin("flwr"))
        threading.Thread(target=registrar.run, args=(keys_stop,), name="supernode-keys",
                         daemon=True).start()
        log.info("edge %d: SuperNode authentication on: only the cloud's members may connect",
                 args.edge_id)
    log.info("edge %d: SuperLink (pid %d) serves %s:%d; clients are told %s", args.edge_id,
             superlink.pid, host, port, advertise)
    tail = Tail(work / "serverapp.log", lambda line: print(f"[serverapp] {line}",
                                                           file=sys.stderr, flush=True))
    try:
        run_id = submit_run(work, app_dir)
        log.info("edge %d: edge ServerApp submitted (run %d)", args.edge_id, run_id)
        status_path = work / "status.json"
        submitted = time.monotonic()
        cloud = CloudWatch(channel)
        while not stop.is_set():
            tail.pump()
            if not (work / "serverapp.log").is_file() and time.monotonic() - submitted > 120:
                print(f"{PROG}: error: the edge ServerApp (run {run_id}) did not start within "
                      f"120 s; see {work / 'superlink.log'}", file=sys.stderr)
                return 1
            if not status_path.is_file() and cloud.done():
                log.info("edge %d: the cloud reports training over; stopping", args.edge_id)
                return 0
            if status_path.is_file():
                time.sleep(0.2)
                tail.pump()
                status = json.loads(status_path.read_text())
                if status.get("state") == "done":
                    log.info("edge %d: training over (%s tasks); stopping", args.edge_id,
                             status.get("tasks"))
                    return 0
                print(f"{PROG}: error: edge ServerApp failed: {status.get('detail')}",
                      file=sys.stderr)
                return 1
            if superlink.poll() is not None:
                print(f"{PROG}: error: flower-superlink exited with code "
                      f"{superlink.proc.returncode}; its log ends with:\n{superlink.tail()}",
                      file=sys.stderr)
                return 1
            stop.wait(0.2)
        log.info("edge %d: stopping on request", args.edge_id)
        return 0
    finally:
        keys_stop.set()
        superlink.stop(grace_s=5.0)
        tail.pump()
        channel.close()


def main(argv: list[str] | None = None) -> int:
    from fedcure_app.runtime.processes import quiet_grpc, role_start

    quiet_grpc()
    args = build_parser().parse_args(argv)
    stop = role_start(args.quiet, log)
    from fedcure_app.flower.fastpath.gate import warn_if_off

    warn_if_off(PROG)  # one line on stderr when Flower runs unchanged (no fast path)
    from edge_server.settings import SettingsError
    from edge_server.superlink import SuperLinkError
    from fedcure_app.protocol.channel import ChannelConfigError
    from fedcure_app.runtime.workdir import drop_work_dir

    try:
        return run_edge(args, stop)
    except (UsageError, ValueError, ChannelConfigError, SettingsError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except (ConnectionError, SuperLinkError, OSError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    finally:  # run_edge stopped the SuperLink and the ServerApp it started
        drop_work_dir(getattr(args, "work_path", None), getattr(args, "temp_work", False))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
