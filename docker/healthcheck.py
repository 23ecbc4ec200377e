#!/opt/venv/bin/python
"""Container healthcheck for the FedCure roles (installed as ``fedcure-healthcheck``).

    fedcure-healthcheck --cloud 127.0.0.1:9090 --insecure          # Monitor.Status over gRPC
    fedcure-healthcheck --cloud 127.0.0.1:9090 --tls-ca /certs/ca.crt \\
        [--tls-cert /certs/client.crt --tls-key /certs/client.key]
    fedcure-healthcheck --tcp 127.0.0.1:9092                        # a port accepts connections

``--cloud`` asks the cloud's standard health service (``grpc.health.v1.Health/Check``, no
token needed): exit 0 when it answers SERVING (the cloud takes registrations or trains), then
prints its phase and progress from ``Monitor.Status``; NOT_SERVING (the run finished or the
cloud is stopping) is unhealthy. ``--tcp`` only opens a TCP connection (the edge's Flower Fleet
API). Exit 1, with one line on stderr, when the check fails.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys


def check_tcp(address: str, timeout: float) -> str:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        return f"{address} accepts connections"


def check_cloud(args: argparse.Namespace) -> str:
    logging.getLogger("fedcure.channel").setLevel(logging.ERROR)  # no --insecure warning
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.channel import open_channel

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = open_channel(args.cloud, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                           tls_key=args.tls_key, insecure=args.insecure,
                           server_name=args.server_name)
    try:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=args.timeout)
        serving = health.status == health_pb2.HealthCheckResponse.SERVING
        if not serving:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
            raise RuntimeError(f"grpc.health.v1 answers {name}")
        reply = pb_grpc.MonitorStub(channel).Status(pb.StatusRequest(), timeout=args.timeout)
    finally:
        channel.close()
    phase = pb.StatusReply.Phase.Name(reply.phase)
    return (f"cloud {phase}: round {reply.round}/{reply.global_rounds}, clients "
            f"{reply.clients_registered}/{reply.expected_clients}, edges "
            f"{reply.edges_connected}/{reply.num_edges}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fedcure-healthcheck", description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--cloud", metavar="HOST:PORT",
                      help="call the cloud's grpc.health.v1 Check (and Monitor.Status)")
    what.add_argument("--tcp", metavar="HOST:PORT", help="open a TCP connection")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (cloud without TLS)")
    p.add_argument("--tls-ca", metavar="FILE", help="CA the cloud's certificate chains to")
    p.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    p.add_argument("--tls-key", metavar="FILE", help="client key (mutual TLS)")
    p.add_argument("--server-name", metavar="NAME", help="name the certificate must carry")
    p.add_argument("--timeout", type=float, default=3.0, metavar="S", help="seconds (default 3)")
    args = p.parse_args(argv)
    try:
        print(check_tcp(args.tcp, args.timeout) if args.tcp else check_cloud(args))
        return 0
    except Exception as err:  # any failure is "unhealthy"; say why in one line
        detail = getattr(err, "details", None)
        msg = detail() if callable(detail) else str(err)
        print(f"fedcure-healthcheck: unhealthy: {type(err).__name__}: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
