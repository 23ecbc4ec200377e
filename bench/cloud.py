"""Benchmark: the cloud server on loopback (issue "Deployment: the cloud, edge and client roles").

Goals, each printed with its measured figure:

1. association: 1,000 clients registering concurrently against one cloud (expected_clients=1000,
   10 fake edges connected) all have their ES address within 10 s of the first call (the time
   includes coalition formation with the configured rule);
2. model transfer: a 100 MB model's round trip edge <-> cloud (Submit of the edge model, its
   aggregation, and the next Task streamed back and decoded) within 2 s;
3. aggregation: one arrival (``strategy.on_arrival``) for a 10M-parameter float32 model within
   50 ms.

The cloud runs in its own process (this script with ``--serve``), the fake edges and clients in
this one, over 127.0.0.1.

    python3 bench/cloud.py [--clients 1000] [--edges 10] [--model-mb 100] [--params 10000000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def model_of(num_bytes: int) -> list[np.ndarray]:
    """A float32 model of about ``num_bytes`` bytes: a big matrix, its bias, a small head."""
    n = max(4096, num_bytes // 4)
    rows = (n - 2048) // 1024
    rest = n - 2048 - rows * 1024
    return [np.zeros((rows, 1024), np.float32), np.zeros(1024 + rest, np.float32),
            np.zeros((1, 1024), np.float32)]


# ----------------------------------------------------------------------------- the cloud process
def serve(args: argparse.Namespace) -> int:
    import logging

    from cloud_server.server import serve as run_server
    from cloud_server.service import CloudService
    from fedcure_app.config import FedCureConfig, apply_flat

    logging.basicConfig(level=logging.DEBUG if os.environ.get("BENCH_DEBUG") else logging.WARNING,
                        format="%(relativeCreated)d %(name)s: %(message)s")
    cfg = apply_flat(FedCureConfig(), {
        "num-clients": args.clients, "num-edges": args.edges, "num-classes": 10,
        "global-rounds": args.rounds, "formation": args.formation, "tau-e": 1,
        "max-concurrent": args.edges,
        # the round trips answer constant models (0.001·i per weight: tens away on 100 MB),
        # not SGD steps: lift the norm screen's step bound out of the way
        "norm-grad-bound": 1e9,
    })
    service = CloudService(cfg, expected_clients=args.clients, register_timeout_s=120,
                           initial_arrays=model_of(int(args.model_mb * 1e6)), write_plots=False)

    async def main() -> None:
        import signal

        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await run_server(service, "127.0.0.1:0", stop=stop,
                         on_bound=lambda port: print(f"PORT {port}", flush=True))

    asyncio.run(main())
    return 0


class CloudProcess:
    def __init__(self, **kw: object) -> None:
        cmd = [sys.executable, __file__, "--serve"]
        for k, v in kw.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=dict(os.environ, GRPC_VERBOSITY="NONE"))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"cloud did not start: {line!r}")
        self.address = f"127.0.0.1:{int(line.split()[1])}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ----------------------------------------------------------------------------- 1. association
async def _association(address: str, clients: int, edges: int, formation: str) -> dict:
    import grpc

    from fedcure_app.devices import PRESETS
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.codec import GRPC_OPTIONS, profile_to_proto

    edge_channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    edge_stub = pb_grpc.EdgeLinkStub(edge_channel)
    streams = [edge_stub.Connect(pb.ConnectRequest(edge_id=m, address=f"10.0.0.{m + 1}:9092"))
               for m in range(edges)]
    first_tasks = [asyncio.ensure_future(s.read()) for s in streams]
    monitor = pb_grpc.MonitorStub(edge_channel)
    while (await monitor.Status(pb.StatusRequest())).edges_connected < edges:
        await asyncio.sleep(0.01)

    rng = np.random.default_rng(0)
    profiles = [profile_to_proto(p) for p in PRESETS.values()]
    reqs = []
    for i in range(clients):
        home = i * edges // clients
        counts = np.zeros(10, np.int64)
        counts[(2 * home + i % 2) % 10] = rng.integers(50, 150)
        reqs.append(pb.RegisterRequest(client_name=f"client-{i:04d}", label_counts=counts.tolist(),
                                       device=profiles[i % len(profiles)], home_edge=home))
    # one channel (one TCP connection) per 10 clients
    channels = [grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
                for _ in range(max(1, clients // 10))]
    stubs = [pb_grpc.AssociationStub(ch) for ch in channels]
    for ch in channels:
        await ch.channel_ready()
    t0 = time.perf_counter()
    done_at: list[float] = []

    async def one(i: int) -> object:
        reply = await stubs[i % len(stubs)].Register(reqs[i], timeout=60)
        done_at.append(time.perf_counter() - t0)
        return reply

    replies = await asyncio.gather(*(one(i) for i in range(clients)))
    total = time.perf_counter() - t0
    ok = all(r.edge_address == f"10.0.0.{r.edge_id + 1}:9092" for r in replies)
    ids = sorted(r.client_id for r in replies)
    await asyncio.gather(*first_tasks)
    for s in streams:
        s.cancel()
    for ch in [*channels, edge_channel]:
        await ch.close()
    sizes = np.bincount([r.edge_id for r in replies], minlength=edges).tolist()
    return {"seconds": total, "first_reply_s": min(done_at),
            "ok": ok and ids == list(range(clients)), "sizes": sizes, "formation": formation}


def bench_association(args: argparse.Namespace) -> dict:
    cloud = CloudProcess(clients=args.clients, edges=args.edges, model_mb=0.01, rounds=1,
                         formation=args.formation)
    try:
        return asyncio.run(_association(cloud.address, args.clients, args.edges, args.formation))
    finally:
        cloud.close()


# ----------------------------------------------------------------------------- 2. model transfer
def bench_transfer(args: argparse.Namespace) -> dict:
    import queue
    import threading

    import grpc

    from fedcure_app.devices import PRESETS
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.codec import (
        GRPC_OPTIONS,
        EdgeLinkClient,
        WithModel,
        decode_arrays,
        encode_parts,
        profile_to_proto,
    )

    trips = args.trips
    cloud = CloudProcess(clients=1, edges=1, model_mb=args.model_mb, rounds=trips + 1,
                         formation="none")
    ch = grpc.insecure_channel(cloud.address, options=GRPC_OPTIONS)
    try:
        link = EdgeLinkClient(ch)  # the fast wire path: models are not copied by protobuf
        tasks: queue.Queue = queue.Queue()
        stream = link.Connect(pb.ConnectRequest(edge_id=0, address="127.0.0.1:9092"))

        def read() -> None:
            try:
                for t in stream:
                    tasks.put((time.perf_counter(), t))
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        pb_grpc.AssociationStub(ch).Register(pb.RegisterRequest(
            client_name="c0", label_counts=[10] * 10, device=profile_to_proto(PRESETS["rpi5"]),
            home_edge=0), timeout=60)
        _, task = tasks.get(timeout=60)
        arrays = decode_arrays(task.model)
        size = len(task.model)
        rows = []
        for i in range(trips):
            t0 = time.perf_counter()
            new = [np.full_like(a, 0.001 * (i + 1)) for a in arrays]  # "training" (not timed)
            t_enc = time.perf_counter()
            parts = encode_parts(new)  # copied once, into the wire bytes
            req = WithModel(pb.SubmitRequest(task_id=task.message.task_id, edge_id=0,
                                             num_samples=10, latency_s=1.0), parts)
            t_send = time.perf_counter()
            reply = link.Submit(req, timeout=60)
            t_reply = time.perf_counter()
            assert reply.accepted, reply.detail
            got_at, task = tasks.get(timeout=60)
            arrays = decode_arrays(task.model)
            t_done = time.perf_counter()
            assert task.message.version == i + 1
            rows.append({
                "encode_s": t_send - t_enc,
                "submit_s": t_reply - t_send,
                "task_s": t_done - t_reply,
                "round_trip_s": t_done - t_enc,
            })
            del t0, got_at
        return {"model_mb": size / 1e6, "rows": rows}
    finally:
        ch.close()
        cloud.close()


# ----------------------------------------------------------------------------- 3. aggregation
def bench_aggregation(args: argparse.Namespace) -> dict:
    from fedcure_app.config import MethodConfig
    from fedcure_app.protocol.codec import decode_arrays, encode_arrays
    from fedcure_app.strategy import EdgeUpdate, FedCureStrategy

    model = model_of(args.params * 4)
    params = sum(a.size for a in model)
    m = 2
    s = FedCureStrategy(MethodConfig(), [[0], [1]], np.ones(2), np.full(2, 1e9),
                        np.tile([0.5, 2.0], (2, 1)), np.full(m, 10.0), model, max_concurrent=1)
    s.dispatch()
    edge_model = decode_arrays(encode_arrays([np.full_like(a, 0.5) for a in model]))
    times = []
    for i in range(args.agg_repeat):
        c = next(iter(s.in_flight))
        d = s.in_flight[c]
        t0 = time.perf_counter()
        s.on_arrival(EdgeUpdate(c, d.version, edge_model, 10, 5.0))
        times.append(time.perf_counter() - t0)
        s.dispatch()
    return {"params": params, "times": times}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--edges", type=int, default=10)
    p.add_argument("--formation", default="fedcure")
    p.add_argument("--model-mb", type=float, default=100.0)
    p.add_argument("--trips", type=int, default=3)
    p.add_argument("--params", type=int, default=10_000_000)
    p.add_argument("--agg-repeat", type=int, default=10)
    p.add_argument("--only", choices=["association", "transfer", "aggregation"])
    # internal: run as the cloud process
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args)

    failed = False
    if args.only in (None, "association"):
        r = bench_association(args)
        good = r["ok"] and r["seconds"] <= 10.0
        failed |= not good
        print(f"association: {args.clients} clients, {args.edges} edges, formation "
              f"{r['formation']}: all answered in {r['seconds']:.2f} s "
              f"(first reply {r['first_reply_s']:.2f} s; coalition sizes {r['sizes']}; "
              f"answers consistent: {r['ok']}) -- goal <= 10 s: {'ok' if good else 'MISSED'}")
    if args.only in (None, "transfer"):
        r = bench_transfer(args)
        for i, row in enumerate(r["rows"]):
            print(f"transfer: {r['model_mb']:.1f} MB model, trip {i + 1}: edge encode "
                  f"{row['encode_s']:.3f} s + Submit (send, decode, aggregate, reply) "
                  f"{row['submit_s']:.3f} s + next Task (stream, decode) {row['task_s']:.3f} s "
                  f"= {row['round_trip_s']:.3f} s")
        best = min(row["round_trip_s"] for row in r["rows"])
        med = statistics.median(row["round_trip_s"] for row in r["rows"])
        good = med <= 2.0
        failed |= not good
        print(f"transfer: round trip median {med:.3f} s (best {best:.3f} s) -- goal <= 2 s: "
              f"{'ok' if good else 'MISSED'}")
    if args.only in (None, "aggregation"):
        r = bench_aggregation(args)
        med = statistics.median(r["times"]) * 1e3
        good = med <= 50.0
        failed |= not good
        print(f"aggregation: on_arrival, {r['params'] / 1e6:.1f}M float32 parameters: median "
              f"{med:.1f} ms (min {min(r['times']) * 1e3:.1f}, max {max(r['times']) * 1e3:.1f}) "
              f"-- goal <= 50 ms: {'ok' if good else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
