"""A fake edge server as its own process (for kill -9 tests and bench/soak.py).

    python -m tests.deployment.edge_proc --cloud 127.0.0.1:PORT --edge-id M [--delay 0.2]
        [--token T] [--tls-ca FILE | --insecure]

It connects (``EdgeLink.Connect``), and answers every task after ``--delay`` seconds with the
deterministic edge model :func:`edge_model` of the task, retrying the Submit while the cloud is
unreachable and reconnecting (with a short back-off) whenever the stream breaks, so it rides
out cloud restarts. With ``--bad-every K`` every K-th task is first answered with bad models
(NaN, wrong shape, far outside the others) that must be refused; with ``--duplicates`` every
accepted answer is sent again and must get the same reply. It prints one line per event:
``task <id>``, ``reply <id> accepted=<0|1> version=<v>``, ``refused <id> <CODE>``,
``rejected <id> <kind> <CODE>`` (a bad model refused), ``BAD-ACCEPTED <id> <kind>`` (a bad
model aggregated), ``not-aggregated <id> <kind>`` (answered but not aggregated: a cloud past the
end), ``duplicate <id> same|DIFFERENT``.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib

import grpc
import numpy as np

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.channel import open_channel
from fedcure_app.protocol.codec import EdgeLinkClient, WithModel, decode_arrays, encode_arrays

RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
         grpc.StatusCode.CANCELLED}


def edge_model(task_model: list[np.ndarray], task_id: str) -> list[np.ndarray]:
    """The edge model a fake edge returns for a task: 0.99·ω + c(task id), c in [0, 0.01),
    float32-exact; a step as small as training's (a digits model moves < 1, inside the cloud's
    step bound)."""
    c = np.float32((zlib.crc32(task_id.encode()) % 1000) / 100_000.0)
    return [(np.asarray(a) * np.float32(0.99) + c).astype(a.dtype) for a in task_model]


def bad_models(arrays: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Edge models the cloud must refuse: NaN, a wrong shape, a norm far outside."""
    nan = [a.copy() for a in arrays]
    nan[0].flat[0] = np.nan
    shape = [np.zeros(a.size + 1, a.dtype) for a in arrays]
    huge = [(a + np.float32(1e6)).astype(a.dtype) for a in arrays]
    return {"nan": nan, "shape": shape, "norm": huge}


def say(*parts: object) -> None:
    print(*parts, flush=True)


def submit(stub: EdgeLinkClient, req: pb.SubmitRequest, model: bytes, stop_at: float
           ) -> pb.SubmitReply | grpc.StatusCode:
    """Submit until it gets an answer (retrying while the cloud is unreachable)."""
    while True:
        try:
            return stub.Submit(WithModel(req, model), timeout=10)
        except grpc.RpcError as err:
            if err.code() not in RETRY or time.monotonic() > stop_at:
                return err.code()
            time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    ch = open_channel(args.cloud, tls_ca=args.tls_ca, insecure=args.insecure)
    stub = EdgeLinkClient(ch)
    address = f"127.0.0.1:{19500 + args.edge_id}"
    seen = 0
    end = time.monotonic() + args.lifetime
    while time.monotonic() < end:
        call = stub.Connect(pb.ConnectRequest(edge_id=args.edge_id, address=address,
                                              token=args.token))
        try:
            for item in call:
                if isinstance(item, WithModel):
                    task, model = item.message, item.model_bytes()
                else:
                    task, model = item, item.model
                say("task", task.task_id)
                seen += 1
                time.sleep(args.delay)
                arrays = edge_model(decode_arrays(model), task.task_id)
                req = pb.SubmitRequest(task_id=task.task_id, edge_id=args.edge_id,
                                       num_samples=10, latency_s=args.delay, token=args.token)
                if args.bad_every and seen % args.bad_every == 0:
                    for kind, bad in bad_models(arrays).items():
                        got = submit(stub, req, encode_arrays(bad), time.monotonic() + 60)
                        if isinstance(got, pb.SubmitReply) and got.accepted:
                            say("BAD-ACCEPTED", task.task_id, kind)
                        elif isinstance(got, pb.SubmitReply):
                            # a cloud that is over answers every Submit "not aggregated"
                            say("not-aggregated", task.task_id, kind)
                        else:
                            say("rejected", task.task_id, kind, got.name)
                good = encode_arrays(arrays)
                reply = submit(stub, req, good, time.monotonic() + 60)
                if isinstance(reply, pb.SubmitReply):
                    say("reply", task.task_id, f"accepted={int(reply.accepted)}",
                        f"version={reply.version}")
                    if args.duplicates:
                        again = submit(stub, req, good, time.monotonic() + 60)
                        say("duplicate", task.task_id, "same" if again == reply else "DIFFERENT")
                else:
                    say("refused", task.task_id, reply.name)
            say("stream over")
            return 0
        except grpc.RpcError as err:
            say("stream broke", err.code().name)
            if err.code() in (grpc.StatusCode.UNAUTHENTICATED,
                              grpc.StatusCode.INVALID_ARGUMENT):
                return 2
            time.sleep(0.3)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="edge_proc")
    p.add_argument("--cloud", required=True)
    p.add_argument("--edge-id", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.1, help="seconds per task")
    p.add_argument("--token", default="")
    p.add_argument("--tls-ca")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--lifetime", type=float, default=300.0, help="give up after (s)")
    p.add_argument("--bad-every", type=int, default=0, help="inject bad models every K tasks")
    p.add_argument("--duplicates", action="store_true", help="re-send every accepted answer")
    args = p.parse_args(argv)
    if not args.tls_ca:
        args.insecure = True
    say("started edge", args.edge_id)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
