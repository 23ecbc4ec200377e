"""The controller's durable state: what a checkpoint holds and how a run resumes from it
(part of :class:`cloud_server.controller.CloudController`). ``cloud_server.checkpoint`` stores
the result atomically; the dataclasses' own ``to_state``/``from_state`` live in
``cloud_server.state``.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from fedcure_app.protocol.codec import CodecError, decode_arrays
from cloud_server.checkpoint import CheckpointError, config_diff
from cloud_server.state import ClientEntry, Phase, TaskState, jsonable

log = logging.getLogger("fedcure.cloud")


class DurableState:
    """``to_state``/``from_state``/``save_checkpoint`` of a :class:`CloudController`."""

    # attributes of CloudController used here (and its methods install, make_task,
    # global_model_bytes, finished)
    cfg: Any
    strategy: Any
    checkpoints: Any
    tasks: dict[str, TaskState]
    clients: dict[str, ClientEntry]
    edge_addresses: dict[int, str]
    t0: float | None

    def save_checkpoint(self) -> None:
        """Write the durable state (worker thread, holding ``self.lock``)."""
        if self.checkpoints is None or self.strategy is None:
            return
        state, models = self.to_state()
        self.checkpoints.save(state, models)

    def to_state(self) -> tuple[dict[str, Any], dict[int, bytes | memoryview]]:
        """The durable state and the model bytes it needs (call holding ``self.lock``)."""
        s = self.strategy
        assert s is not None and self.assignment is not None
        strategy_state = s.state_dict()
        strategy_state.pop("global_arrays")
        models: dict[int, bytes | memoryview] = {s.version: self.global_model_bytes()}
        tasks: dict[str, Any] = {}
        in_flight: dict[str, str] = {}
        now_mono, now_wall = time.monotonic(), time.time()
        for tid, t in list(self.tasks.items()):
            d = t.dispatch
            if s.in_flight.get(d.coalition) is d:
                in_flight[str(d.coalition)] = tid
                if d.version not in models:
                    blob = t.message.model_bytes()
                    if len(blob) == 0:  # pragma: no cover - a live task always keeps its model
                        raise RuntimeError(f"task {tid} in flight without its model")
                    models[d.version] = blob
            elif t.reply is None and t.expired is None:
                continue  # a task neither answered, expired nor expected: nothing to remember
            tasks[tid] = t.to_state(now_mono, now_wall)
        state = {
            "config": self.cfg.model_dump(mode="json"),
            "expected_clients": self.expected_clients,
            "phase": "done" if self.finished() else "training",
            "strategy": strategy_state,
            "clients": [c.to_state() for c in sorted(self.clients.values(),
                                                     key=lambda c: c.client_id or 0)],
            "assignment": np.asarray(self.assignment).tolist(),
            "initial_assignment": np.asarray(self.initial_assignment).tolist(),
            "formation": {"moves": getattr(self.formation, "moves", None),
                          "stable": getattr(self.formation, "stable", None)},
            "jsd": list(self.jsd_pair) if self.jsd_pair else None,
            "initial_accuracy": self.initial_accuracy,
            "records": self.records,
            "faults": self.faults,
            "tasks": tasks,
            "in_flight_tasks": in_flight,
            "screen": self.screen.state_dict(),
            "claims": dict(self.claims),
            "edges": {str(m): a for m, a in self.edge_addresses.items()},
            "elapsed_s": (now_mono - self.t0) if self.t0 is not None else 0.0,
        }
        return jsonable(state), models

    def from_state(self, state: dict[str, Any], models: dict[int, bytes]) -> None:
        """Rebuild the controller (before any request) from :meth:`to_state`'s output."""
        diff = config_diff(state.get("config", {}), self.cfg.model_dump(mode="json"))
        if diff:
            raise CheckpointError("the checkpoint was written with a different configuration ("
                                  + "; ".join(diff[:4]) + "); use another --out or the same flags")
        if int(state["expected_clients"]) != self.expected_clients:
            raise CheckpointError(f"the checkpoint expects {state['expected_clients']} clients, "
                                  f"not {self.expected_clients}")
        try:
            version = int(state["strategy"]["version"])
            arrays = [np.array(a) for a in decode_arrays(models[version])]
        except (KeyError, CodecError) as err:
            raise CheckpointError(f"checkpoint global model unreadable: {err}") from None
        clients = [ClientEntry.from_state(c) for c in state["clients"]]
        jsd = tuple(state["jsd"]) if state.get("jsd") else None
        self.clients = {c.name: c for c in clients}
        s = self.install(clients, np.asarray(state["initial_assignment"], dtype=np.int64),
                         np.asarray(state["assignment"], dtype=np.int64),
                         SimpleNamespace(**state["formation"]), jsd, arrays)  # type: ignore[arg-type]
        s.load_state_dict({**state["strategy"], "global_arrays": arrays})
        self.records = list(state["records"])
        self.faults = list(state.get("faults", []))
        self.initial_accuracy = state.get("initial_accuracy")
        self.screen.load_state_dict(state["screen"])
        self.claims = {str(k): int(v) for k, v in state.get("claims", {}).items()}
        for m, addr in state.get("edges", {}).items():
            if int(m) in self.edge_addresses:
                self.edge_addresses[int(m)] = addr
        now_mono, now_wall = time.monotonic(), time.time()
        live = {v: k for k, v in state["in_flight_tasks"].items()}
        for tid, t in state["tasks"].items():
            if tid in live:
                d = s.in_flight[int(t["coalition"])]
                task = self.make_task(d, task_id=tid, model=models[d.version])
                task.sent_at = TaskState.sent_from_state(t, now_mono, now_wall)
            else:
                task = TaskState.finished_from_state(tid, t)
            self.tasks[tid] = task
        missing = set(s.in_flight) - {int(m) for m in state["in_flight_tasks"]}
        if missing:
            raise CheckpointError(f"checkpoint lacks the tasks of coalitions {sorted(missing)}")
        self.t0 = now_mono - float(state["elapsed_s"])
        self.phase = Phase.TRAINING
        self.forming = True
        log.info("resumed from checkpoint: version %d, round %d, %d records, %d coalitions in "
                 "flight %s, unavailable %s", s.version, s.round, len(self.records),
                 len(s.in_flight), sorted(s.in_flight), sorted(s.unavailable))


__all__ = ["DurableState"]
