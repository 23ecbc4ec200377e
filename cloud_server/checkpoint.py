"""Durable cloud state: atomic checkpoints the cloud resumes from after a crash (SIGKILL).

Layout of a checkpoint folder (``<out>/checkpoint`` by default)::

    state.json              everything but the models; replaced atomically (the commit point)
    model-v<V>.safetensors  the global model of version V (codec format), written once, atomically

``state.json`` names the model files it needs (the global version and the base versions of the
tasks in flight) with their SHA-256. A model file is always written (temp file, fsync,
``os.replace``, fsync of the folder) before the ``state.json`` that refers to it, and files no
state refers to are removed afterwards, so a crash at any point leaves the previous or the new
checkpoint whole.

The cloud writes a checkpoint after formation, after every accepted update *before* it answers
the Submit (an ``accepted=True`` reply means the update is on disk), and after every change of
coalition availability. :func:`snapshot` and :func:`restore` map a :class:`CloudService` to and
from the state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from cloud_server.service import CloudService

log = logging.getLogger("fedcure.cloud.checkpoint")

FORMAT = "fedcure-cloud-checkpoint/1"
STATE = "state.json"
#: configuration keys that may change between a run and its resumption
MUTABLE_KEYS = {("run", "global_rounds"), ("run", "eval_every"), ("data", "data_dir")}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit this run (one-line message)."""


def model_name(version: int) -> str:
    return f"model-v{int(version)}.safetensors"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | memoryview, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, os.replace."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path.parent)


class CheckpointStore:
    """One checkpoint folder: :meth:`save` and :meth:`load` (see the module docstring)."""

    def __init__(self, directory: str | Path, *, sync: bool = True) -> None:
        self.dir = Path(directory)
        self.sync = sync
        self.writes = 0
        self.seconds = 0.0

    @property
    def state_path(self) -> Path:
        return self.dir / STATE

    def exists(self) -> bool:
        return self.state_path.is_file()

    def save(self, state: dict[str, Any], models: dict[int, bytes | memoryview]) -> None:
        """Write the model files ``state`` lacks on disk, then ``state.json``, then prune."""
        t = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        digests: dict[str, str] = {}
        for version, blob in sorted(models.items()):
            path = self.dir / model_name(version)
            digest = hashlib.sha256(blob).hexdigest()
            digests[str(version)] = digest
            if not path.exists():
                write_atomic(path, blob, sync=self.sync)
        state = dict(state, format=FORMAT, models=digests, saved_at=time.time())
        write_atomic(self.state_path, json.dumps(state, allow_nan=False).encode(), sync=self.sync)
        keep = {model_name(int(v)) for v in digests}
        for p in self.dir.glob("model-v*.safetensors"):
            if p.name not in keep:
                p.unlink(missing_ok=True)
        for p in self.dir.glob(".*.tmp"):
            p.unlink(missing_ok=True)
        self.writes += 1
        self.seconds += time.perf_counter() - t

    def load(self) -> tuple[dict[str, Any], dict[int, bytes]]:
        """The state and the model bytes per version; :class:`CheckpointError` if damaged."""
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"cannot read checkpoint {self.state_path}: {err}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(f"{self.state_path} is not a {FORMAT} checkpoint")
        models: dict[int, bytes] = {}
        for v, digest in state["models"].items():
            path = self.dir / model_name(int(v))
            try:
                blob = path.read_bytes()
            except OSError as err:
                raise CheckpointError(f"checkpoint model {path} is missing: {err}") from None
            if hashlib.sha256(blob).hexdigest() != digest:
                raise CheckpointError(f"checkpoint model {path} is damaged (SHA-256 mismatch)")
            models[int(v)] = blob
        return state, models


# ------------------------------------------------------------------------------ service mapping
def _config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    out = []
    for section, fields in current.items():
        if not isinstance(fields, dict):
            continue
        for name, value in fields.items():
            if (section, name) in MUTABLE_KEYS:
                continue
            old = saved.get(section, {}).get(name)
            if old != value:
                out.append(f"{section}.{name}: {old!r} -> {value!r}")
    return out


def _reply_dict(reply: Any) -> dict[str, Any] | None:
    if reply is None:
        return None
    return {"accepted": bool(reply.accepted), "version": int(reply.version),
            "detail": str(reply.detail)}


def snapshot(service: "CloudService") -> tuple[dict[str, Any], dict[int, bytes | memoryview]]:
    """The service's durable state and the model bytes it needs (call holding ``service.lock``)."""
    s = service.strategy
    assert s is not None and service.assignment is not None
    strategy_state = s.state_dict()
    strategy_state.pop("global_arrays")
    models: dict[int, bytes | memoryview] = {s.version: service._global_model_bytes()}
    tasks: dict[str, Any] = {}
    in_flight: dict[str, str] = {}
    now_mono, now_wall = time.monotonic(), time.time()
    for tid, t in list(service._tasks.items()):
        d = t.dispatch
        live = s.in_flight.get(d.coalition) is d
        if live:
            in_flight[str(d.coalition)] = tid
            if d.version not in models:
                blob = t.message.model_bytes()
                if len(blob) == 0:  # pragma: no cover - a live task always keeps its model
                    raise RuntimeError(f"task {tid} in flight without its model")
                models[d.version] = blob
        elif t.reply is None and t.expired is None:
            continue  # a task neither answered, expired nor expected: nothing to remember
        sent = t.sent_at
        tasks[tid] = {
            "coalition": d.coalition, "round": d.round, "version": d.version,
            "reply": _reply_dict(t.reply), "expired": t.expired,
            "sent_wall": None if sent is None else now_wall - (now_mono - sent),
        }
    formation = service.formation
    state = {
        "config": service.cfg.model_dump(mode="json"),
        "expected_clients": service.expected_clients,
        "phase": "done" if service._finished_in_checkpoint() else "training",
        "strategy": strategy_state,
        "clients": [
            {"name": c.name, "label_counts": c.label_counts.tolist(),
             "profile": c.profile.model_dump(mode="json"), "home_edge": c.home_edge,
             "client_id": c.client_id, "edge_id": c.edge_id, "supernode_key": c.supernode_key}
            for c in sorted(service.clients.values(), key=lambda c: c.client_id or 0)
        ],
        "assignment": np.asarray(service.assignment).tolist(),
        "initial_assignment": np.asarray(service.initial_assignment).tolist(),
        "formation": {"moves": getattr(formation, "moves", None),
                      "stable": getattr(formation, "stable", None)},
        "jsd": list(service._jsd_pair) if service._jsd_pair else None,
        "initial_accuracy": service.initial_accuracy,
        "records": service.records,
        "faults": service.faults,
        "tasks": tasks,
        "in_flight_tasks": in_flight,
        "screen": service.screen.state_dict(),
        "claims": dict(getattr(service, "claims", {})),
        "edges": {str(m): e.address for m, e in service._edges.items()},
        "elapsed_s": (now_mono - service._t0) if service._t0 is not None else 0.0,
    }
    return _jsonable(state), models


def _jsonable(obj: Any) -> Any:
    """numpy scalars/arrays to Python, recursively."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def restore(service: "CloudService", state: dict[str, Any], models: dict[int, bytes]) -> None:
    """Rebuild ``service`` (started, before any RPC) from a checkpoint."""
    from fedcure_app.devices import DeviceProfile
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol.codec import CodecError, WithModel, decode_arrays
    from fedcure_app.strategy import Dispatch

    from cloud_server.service import _Client, _Task

    diff = _config_diff(state.get("config", {}), service.cfg.model_dump(mode="json"))
    if diff:
        raise CheckpointError("the checkpoint was written with a different configuration ("
                              + "; ".join(diff[:4]) + "); use another --out or the same flags")
    if int(state["expected_clients"]) != service.expected_clients:
        raise CheckpointError(f"the checkpoint expects {state['expected_clients']} clients, "
                              f"not {service.expected_clients}")
    try:
        version = int(state["strategy"]["version"])
        arrays = [np.array(a) for a in decode_arrays(models[version])]
    except (KeyError, CodecError) as err:
        raise CheckpointError(f"checkpoint global model unreadable: {err}") from None
    clients = [
        _Client(c["name"], np.asarray(c["label_counts"], dtype=np.int64),
                DeviceProfile(**c["profile"]), c["home_edge"], int(c["client_id"]),
                int(c["edge_id"]), supernode_key=str(c.get("supernode_key", "")))
        for c in state["clients"]
    ]
    jsd = tuple(state["jsd"]) if state.get("jsd") else None
    service.clients = {c.name: c for c in clients}
    service._install(
        clients, np.asarray(state["initial_assignment"], dtype=np.int64),
        np.asarray(state["assignment"], dtype=np.int64),
        SimpleNamespace(**state["formation"]), jsd, arrays)
    service.strategy.load_state_dict({**state["strategy"], "global_arrays": arrays})
    service.records = list(state["records"])
    service.faults = list(state.get("faults", []))
    service.initial_accuracy = state.get("initial_accuracy")
    service.screen.load_state_dict(state["screen"])
    if hasattr(service, "claims"):
        service.claims = {str(k): int(v) for k, v in state.get("claims", {}).items()}
    for m, addr in state.get("edges", {}).items():
        if int(m) in service._edges:
            service._edges[int(m)].address = addr
    now_mono, now_wall = time.monotonic(), time.time()
    live = {v: k for k, v in state["in_flight_tasks"].items()}
    s = service.strategy
    for tid, t in state["tasks"].items():
        m = int(t["coalition"])
        sent = None if t["sent_wall"] is None else now_mono - max(0.0, now_wall - t["sent_wall"])
        if tid in live:
            d = s.in_flight[m]
            task = service._make_task(d, task_id=tid, model=models[d.version])
            task.sent_at = sent
        else:
            d = Dispatch(round=int(t["round"]), coalition=m, version=int(t["version"]),
                         clients=(), frequencies_ghz={}, t_hat_round_s=0.0, t_hat_s=0.0)
            task = _Task(tid, d, WithModel(pb.Task(task_id=tid), b""), now_mono)
            if t["reply"] is not None:
                task.reply = pb.SubmitReply(**t["reply"])
            task.expired = t["expired"]
        service._tasks[tid] = task
    missing = set(s.in_flight) - {int(m) for m in state["in_flight_tasks"]}
    if missing:
        raise CheckpointError(f"checkpoint lacks the tasks of coalitions {sorted(missing)}")
    service._t0 = now_mono - float(state["elapsed_s"])
    log.info("resumed from checkpoint: version %d, round %d, %d records, %d coalitions in "
             "flight %s, unavailable %s", s.version, s.round, len(service.records),
             len(s.in_flight), sorted(s.in_flight), sorted(s.unavailable))


__all__ = ["CheckpointError", "CheckpointStore", "FORMAT", "restore", "snapshot", "write_atomic"]
