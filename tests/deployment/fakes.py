"""Fake edges and clients speaking the cloud protocol with the generated stubs."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import grpc
import numpy as np

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.devices import PRESETS
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import (
    GRPC_OPTIONS,
    EdgeLinkClient,
    WithModel,
    decode_arrays,
    encode_arrays,
    encode_parts,
)

from cloud_server.server import CloudServer
from cloud_server.service import CloudService

SMALL_MODEL = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]


def make_cfg(clients: int, edges: int, **flat) -> FedCureConfig:
    # the fake edges answer constant models no SGD step makes (up to tens away from the
    # global model): a norm-grad-bound that lets them through the step bound (lr·τ_c·τ_e·G =
    # 200 here); tests of the screen set their own
    base = {"num-clients": clients, "num-edges": edges, "num-classes": 4, "global-rounds": 5,
            "tau-e": 2, "tau-c": 1, "formation": "none", "norm-grad-bound": 10_000.0}
    base.update(flat)
    return apply_flat(FedCureConfig(), base)


def start_cloud(cfg: FedCureConfig, *, expected: int, out_dir=None, timeout: float = 20.0,
                token: str = "", initial=None, evaluator=None) -> CloudServer:
    service = CloudService(
        cfg, expected_clients=expected, out_dir=out_dir, register_timeout_s=timeout,
        token=token, initial_arrays=SMALL_MODEL if initial is None else initial,
        evaluator=evaluator, write_plots=out_dir is not None,
    )
    server = CloudServer(service, "127.0.0.1:0")
    server.start()
    return server


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=GRPC_OPTIONS)


def register_request(name: str, counts: Sequence[int], home: int | None = None,
                     preset: str = "rpi4", token: str = "") -> pb.RegisterRequest:
    from fedcure_app.protocol.codec import profile_to_proto

    req = pb.RegisterRequest(client_name=name, label_counts=list(counts),
                             device=profile_to_proto(PRESETS[preset]), token=token)
    if home is not None:
        req.home_edge = home
    return req


class FakeEdge:
    """Connects as edge ``edge_id`` and queues the tasks the cloud streams to it.

    ``fast``: use the codec's :class:`EdgeLinkClient` (models beside the messages) instead of the
    plain generated stub; tasks are handed out as plain ``pb.Task`` either way.
    """

    def __init__(self, address: str, edge_id: int, token: str = "", fast: bool = False) -> None:
        self.edge_id = edge_id
        self.fast = fast
        self.address = f"127.0.0.1:{19000 + edge_id}"
        self.channel = channel(address)
        self.stub = EdgeLinkClient(self.channel) if fast else pb_grpc.EdgeLinkStub(self.channel)
        self.tasks: queue.Queue = queue.Queue()
        self.end: grpc.RpcError | None = None
        self.ended = threading.Event()
        self.call = self.stub.Connect(
            pb.ConnectRequest(edge_id=edge_id, address=self.address, token=token))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for task in self.call:
                self.tasks.put(task.full() if isinstance(task, WithModel) else task)
        except grpc.RpcError as err:
            self.end = err
        finally:
            self.ended.set()

    def next_task(self, timeout: float = 10.0) -> pb.Task:
        return self.tasks.get(timeout=timeout)

    def submit(self, task: pb.Task, arrays=None, *, value: float | None = 1.0, samples: int = 10,
               model: bytes | None = None, task_id: str | None = None, edge_id: int | None = None,
               token: str = "") -> pb.SubmitReply:
        if model is None:
            if arrays is None:
                arrays = [np.full_like(a, value) for a in decode_arrays(task.model)]
            model = encode_parts(arrays) if self.fast else encode_arrays(arrays)
        stats = [pb.ClientStat(client_id=c, edge_round=0, samples=5, seconds=0.5,
                               f_applied_ghz=task.frequencies_ghz[c], loss=1.0)
                 for c in task.client_ids]
        head = pb.SubmitRequest(
            task_id=task.task_id if task_id is None else task_id,
            edge_id=self.edge_id if edge_id is None else edge_id,
            num_samples=samples, stats=stats, latency_s=0.1, token=token)
        if self.fast:
            return self.stub.Submit(WithModel(head, model), timeout=10)
        head.model = model if isinstance(model, bytes) else b"".join(model)
        return self.stub.Submit(head, timeout=10)

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()
