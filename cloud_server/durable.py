"""The cloud's durable state: what a checkpoint holds, and how a run resumes from it.

:class:`Durability` builds the checkpoint state from the run's state objects and stores it with
its :class:`~cloud_server.checkpoint.CheckpointStore` (which writes atomically and knows nothing
of the cloud); the dataclasses' own ``to_state``/``from_state`` live in ``cloud_server.state``.
Resuming takes two steps: :meth:`Durability.read` checks a checkpoint against this run and
decodes the federation it describes (the controller installs it), then :meth:`~Durability.restore`
puts back everything else.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol.codec import CodecError, decode_arrays
from cloud_server.checkpoint import CheckpointError, CheckpointStore, DiskFull, config_diff
from cloud_server.screening import NormScreen
from cloud_server.state import (
    ClientEntry, Federation, Roster, RunLog, TaskBook, TaskState, jsonable,
)

log = logging.getLogger("fedcure.cloud")


@dataclass(frozen=True)
class Saved:
    """A checkpoint read back: its state and models, and the federation it describes."""

    state: dict[str, Any]
    models: dict[int, bytes]
    clients: list[ClientEntry]
    initial_assignment: np.ndarray
    assignment: np.ndarray
    formation: dict[str, Any]
    jsd: tuple[float, float] | None
    arrays: list[np.ndarray]


class Durability:
    """Checkpoint state of a run: :meth:`save` (after every change) and resumption.

    Parameters
    ----------
    cfg:
        The configuration; a checkpoint written with another one (beyond the keys a resumed run
        may change) is refused.
    store:
        Where checkpoints go (None: nothing is saved).
    roster, log, tasks, screen:
        The state objects a checkpoint holds besides the federation.
    """

    def __init__(self, cfg: FedCureConfig, store: CheckpointStore | None, roster: Roster,
                 log: RunLog, tasks: TaskBook, screen: NormScreen) -> None:
        self.cfg = cfg
        self.store = store
        self.roster = roster
        self.log = log
        self.tasks = tasks
        self.screen = screen
        #: why the last checkpoint was not written for want of space (None: it was written)
        self.disk_full: str | None = None

    def save(self, federation: Federation | None, *, required: bool = True) -> None:
        """Write the durable state (worker thread, holding the controller's lock); nothing
        before formation or without a store.

        A full disk raises :class:`~cloud_server.checkpoint.DiskFull` when ``required`` (an
        accepted update: it is rolled back and refused, so nothing acknowledged is only in
        memory); otherwise (an availability change, which nobody is told is durable) the next
        write catches up. Either way one line says so when the disk fills and one when a
        checkpoint is written again."""
        if self.store is None or federation is None:
            return
        state, models = self.state(federation)
        try:
            self.store.save(state, models)
        except DiskFull as err:
            if self.disk_full is None:
                log.warning("cloud disk full: %s; updates are refused (RESOURCE_EXHAUSTED) "
                            "until space returns, the last checkpoint stays whole",
                            err.strerror)
            self.disk_full = str(err.strerror)
            if required:
                raise
            return
        if self.disk_full is not None:
            log.warning("cloud disk has space again: checkpoint written; updates are taken again")
            self.disk_full = None

    def state(self, federation: Federation) -> tuple[dict[str, Any], dict[int, bytes | memoryview]]:
        """The durable state and the model bytes it needs (holding the lock)."""
        fed, s = federation, federation.strategy
        strategy_state = s.state_dict()
        strategy_state.pop("global_arrays")
        models: dict[int, bytes | memoryview] = {s.version: self.tasks.model_bytes(s)}
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
        reg, run = self.roster, self.log
        state = {
            "config": self.cfg.model_dump(mode="json"),
            "expected_clients": reg.expected_clients,
            "phase": "done" if fed.finished(self.cfg.run.global_rounds) else "training",
            "strategy": strategy_state,
            "clients": [c.to_state() for c in reg.by_id()],
            "assignment": np.asarray(fed.assignment).tolist(),
            "initial_assignment": np.asarray(fed.initial_assignment).tolist(),
            "formation": dict(fed.formation),
            "jsd": list(fed.jsd) if fed.jsd else None,
            "initial_accuracy": run.initial_accuracy,
            "initial_evaluation": run.initial_evaluation,
            "records": run.records,
            "faults": run.faults,
            "tasks": tasks,
            "in_flight_tasks": in_flight,
            "screen": self.screen.state_dict(),
            "claims": dict(reg.claims),
            "edges": {str(m): a for m, a in reg.edge_addresses.items()},
            "elapsed_s": (now_mono - run.t0) if run.t0 is not None else 0.0,
        }
        return jsonable(state), models

    def read(self, state: dict[str, Any], models: dict[int, bytes]) -> Saved:
        """Check a checkpoint against this run and decode the federation it describes."""
        diff = config_diff(state.get("config", {}), self.cfg.model_dump(mode="json"),
                           FedCureConfig().model_dump(mode="json"))
        if diff:
            raise CheckpointError("the checkpoint was written with a different configuration ("
                                  + "; ".join(diff[:4]) + "); use another --out or the same flags")
        expected = self.roster.expected_clients
        if int(state["expected_clients"]) != expected:
            raise CheckpointError(f"the checkpoint expects {state['expected_clients']} clients, "
                                  f"not {expected}")
        try:
            version = int(state["strategy"]["version"])
            arrays = [np.array(a) for a in decode_arrays(models[version])]
        except (KeyError, CodecError) as err:
            raise CheckpointError(f"checkpoint global model unreadable: {err}") from None
        return Saved(
            state=state, models=models,
            clients=[ClientEntry.from_state(c) for c in state["clients"]],
            initial_assignment=np.asarray(state["initial_assignment"], dtype=np.int64),
            assignment=np.asarray(state["assignment"], dtype=np.int64),
            formation={"moves": state["formation"].get("moves"),
                       "stable": state["formation"].get("stable")},
            jsd=tuple(state["jsd"]) if state.get("jsd") else None,  # type: ignore[arg-type]
            arrays=arrays,
        )

    def restore(self, federation: Federation, saved: Saved) -> None:
        """Put back the strategy's state, the log, the screen, the claims and edges, and the
        tasks of a checkpoint, into the just installed ``federation`` (before any request)."""
        state, models = saved.state, saved.models
        s = federation.strategy
        s.load_state_dict({**state["strategy"], "global_arrays": saved.arrays})
        run = self.log
        run.records[:] = list(state["records"])
        run.faults[:] = list(state.get("faults", []))
        run.initial_accuracy = state.get("initial_accuracy")
        run.initial_evaluation = state.get("initial_evaluation")
        self.screen.load_state_dict(state["screen"])
        self.roster.restore(
            saved.clients, {str(k): int(v) for k, v in state.get("claims", {}).items()},
            {int(m): a for m, a in state.get("edges", {}).items()})
        now_mono, now_wall = time.monotonic(), time.time()
        live = {v: k for k, v in state["in_flight_tasks"].items()}
        for tid, t in state["tasks"].items():
            if tid in live:
                d = s.in_flight[int(t["coalition"])]
                task = self.tasks.make(d, s, task_id=tid, model=models[d.version])
                task.sent_at = TaskState.sent_from_state(t, now_mono, now_wall)
            else:
                self.tasks.add(TaskState.finished_from_state(tid, t))
        missing = set(s.in_flight) - {int(m) for m in state["in_flight_tasks"]}
        if missing:
            raise CheckpointError(f"checkpoint lacks the tasks of coalitions {sorted(missing)}")
        run.t0 = now_mono - float(state["elapsed_s"])
        recovered = self.store.recovered if self.store is not None else None
        if recovered is not None:  # a torn or damaged file was passed over: one line
            line = f"{recovered} (version {s.version})"
            log.warning("%s", line)
            run.fault("checkpoint-recovered", None, line, s.round)
        log.info("resumed from checkpoint: version %d, round %d, %d records, %d coalitions in "
                 "flight %s, unavailable %s", s.version, s.round, len(run.records),
                 len(s.in_flight), sorted(s.in_flight), sorted(s.unavailable))


__all__ = ["Durability", "Saved"]
