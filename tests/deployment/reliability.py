"""Helpers for the reliability tests: a live cloud's exact state, raw calls, fast fake devices."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from cloud_server.server import CloudServer
from cloud_server.service import CloudService
from fedcure_app.devices import DeviceProfile
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import profile_to_proto
from tests.deployment.fakes import SMALL_MODEL, FakeEdge, channel, make_cfg

ROOT = Path(__file__).resolve().parents[2]

#: a device so fast that a coalition's prior latency is microseconds (deadlines = the minimum)
FAST = DeviceProfile(name="fast", f_min_ghz=1.0, f_max_ghz=4.0,
                     cycles_per_sample={"digits": 1e3, "mnist": 1e3, "cifar10": 1e3},
                     uplink_mbps=1e4, downlink_mbps=1e4, kappa=1e-28, jitter=0.0)

#: a device whose edge round takes 0.1 s at f_max (32 samples): coalition prior 0.2 s at τ_e = 2
TIMED = FAST.model_copy(update={"name": "timed", "cycles_per_sample": {
    "digits": 1.25e7, "mnist": 1.25e7, "cifar10": 1.25e7}})


def request(name: str, counts: Sequence[int], home: int | None = None, token: str = "",
            profile: DeviceProfile = FAST) -> pb.RegisterRequest:
    req = pb.RegisterRequest(client_name=name, label_counts=list(counts),
                             device=profile_to_proto(profile), token=token)
    if home is not None:
        req.home_edge = home
    return req


def one_hot(i: int, classes: int = 4, n: int = 20) -> list[int]:
    out = [0] * classes
    out[i % classes] = n
    return out


def start(cfg: Any, *, expected: int, out_dir: Path | None = None, checkpoint: bool = False,
          resume: bool = False, max_message_bytes: int | None = None,
          initial: list[np.ndarray] | None = None, token: str = "") -> CloudServer:
    service = CloudService(
        cfg, expected_clients=expected, out_dir=out_dir, register_timeout_s=20, token=token,
        initial_arrays=SMALL_MODEL if initial is None else initial, write_plots=False,
        checkpoint_dir=(out_dir / "checkpoint") if checkpoint and out_dir else None,
        resume=resume)
    server = CloudServer(service, "127.0.0.1:0", max_message_bytes=max_message_bytes)
    server.start()
    return server


def register_all(address: str, reqs: list[pb.RegisterRequest], timeout: float = 20.0
                 ) -> list[pb.RegisterReply]:
    ch = channel(address)
    stub = pb_grpc.AssociationStub(ch)
    try:
        futs = [stub.Register.future(r, timeout=timeout) for r in reqs]
        return [f.result() for f in futs]
    finally:
        ch.close()


def federation(cleanup: list, clients: int = 4, edges: int = 2, **flat: Any
               ) -> tuple[CloudServer, list[FakeEdge]]:
    """A training cloud (formation ``none``, home ES = i % M) with connected fake edges."""
    flat.setdefault("global-rounds", 1000)
    cfg = make_cfg(clients, edges, **flat)
    server = start(cfg, expected=clients)
    cleanup.append(server)
    fakes = [FakeEdge(server.address, m) for m in range(edges)]
    cleanup.extend(fakes)
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % edges)
                                  for i in range(clients)])
    return server, fakes


def state_of(server: CloudServer) -> dict[str, Any]:
    """Everything a bad request must not change: model bytes, version, queues, in flight, ..."""

    def grab() -> dict[str, Any]:
        svc = server.service.controller
        with svc.lock:
            s = svc.strategy
            if s is None:
                return {"phase": svc.phase, "clients": sorted(svc.clients)}
            digest = hashlib.sha256()
            for a in s.global_arrays:
                digest.update(np.ascontiguousarray(a).tobytes())
            return {
                "phase": svc.phase, "clients": sorted(svc.clients),
                "model": digest.hexdigest(), "version": s.version, "round": s.round,
                "queues": np.asarray(s.scheduler.queues.values).tolist(),
                "in_flight": {m: (d.version, d.round) for m, d in s.in_flight.items()},
                "unavailable": sorted(s.unavailable),
                "estimator": json.dumps(s.estimator.state_dict()),
                "participation": s.participation.tolist(),
                "records": len(svc.records), "screen": list(svc.screen.history),
                "answered": sorted(t for t, x in svc.tasks.items() if x.reply is not None),
            }

    return server.call(grab)


def raw(ch: grpc.Channel, method: str, data: bytes, timeout: float = 5.0) -> bytes:
    """A unary call with raw request bytes (``method`` like ``EdgeLink/Submit``)."""
    fn = ch.unary_unary(f"/fedcure.v1.{method}", request_serializer=lambda b: b,
                        response_deserializer=lambda b: b)
    return fn(data, timeout=timeout)


def code_of(fn: Any) -> grpc.StatusCode:
    """The status code ``fn()`` fails with (AssertionError when it succeeds)."""
    try:
        fn()
    except grpc.RpcError as err:
        return err.code()
    raise AssertionError("the call succeeded")


# ------------------------------------------------------------------------------ processes
class Proc:
    """A Python module run as a process, its output lines collected (stop = SIGKILL)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=full,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r}; log:\n{''.join(self.log)}")

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    stop = kill


def wait_until(cond: Any, timeout: float = 20.0, period: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(period)
    raise AssertionError("condition not reached in time")
