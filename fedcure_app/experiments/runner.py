"""Running the simulations an experiment asks for: deduplicated, cached on disk, with progress.

An experiment *plans* a list of :class:`RunSpec` (a label, a configuration, whether the run needs
training at all); the :class:`Runner` runs each distinct one once through
:func:`fedcure_app.simulation.engine.simulate` (or, for schedule-only runs, the same engine with a
:class:`ScheduleOnlyExecutor`), keeps the result dicts, and stores them gzipped under
``cache_dir`` so an interrupted ``fedcure experiment all`` resumes where it stopped.

Schedule-only runs: the engine's latencies come from the device profiles on a seeded clock and
never from the executor (see ``simulation/engine.py``), so the schedule, the latencies, the
virtual queues and the participation of a run do not depend on the model. The efficiency
experiment therefore replays long schedules without training; their accuracy fields are None.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.data import Dataset
from fedcure_app.tasks import EdgeResult, EdgeTask

log = logging.getLogger(__name__)

#: Bump when the stored result format or its meaning changes (invalidates the cache).
CACHE_VERSION = 1


@dataclass(frozen=True)
class RunSpec:
    """One simulation an experiment needs.

    ``eval_samples``: test samples evaluated (seeded subset; None = all);
    ``schedule_only``: no training (see module docstring).
    """

    label: str
    cfg: FedCureConfig
    eval_samples: int | None = None
    schedule_only: bool = False

    @property
    def key(self) -> str:
        """Content hash of what the result depends on (the data directory excluded)."""
        cfg = self.cfg.model_dump(mode="json")
        cfg["data"].pop("data_dir", None)
        blob = json.dumps({"v": CACHE_VERSION, "cfg": cfg, "eval": self.eval_samples,
                           "schedule_only": self.schedule_only}, sort_keys=True)
        return hashlib.blake2b(blob.encode(), digest_size=10).hexdigest()


class ScheduleOnlyExecutor:
    """Returns the task's model unchanged, weighted by the coalition's samples: no training."""

    def __init__(self, client_samples: np.ndarray) -> None:
        self.client_samples = np.asarray(client_samples, dtype=np.int64)

    def run(self, task: EdgeTask) -> EdgeResult:
        return EdgeResult(
            task_id=task.task_id, coalition=task.coalition, arrays=list(task.arrays),
            num_samples=int(self.client_samples[list(task.clients)].sum()),
        )

    def close(self) -> None:
        """Nothing to release."""


def eval_view(dataset: Dataset, samples: int | None, seed: int = 0) -> Dataset:
    """``dataset`` with its test split cut to a seeded random subset of ``samples`` (or as is)."""
    if samples is None or samples >= dataset.test_size:
        return dataset
    if samples < 1:
        raise ValueError(f"eval samples must be >= 1, got {samples}")
    idx = np.sort(np.random.default_rng(seed).permutation(dataset.test_size)[:samples])
    return dataclasses.replace(dataset, x_test=dataset.x_test[idx], y_test=dataset.y_test[idx])


def _schedule_only(spec: RunSpec, dataset: Dataset,
                   on_round: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    from fedcure_app.simulation.engine import SimulationEngine, build_federation

    rounds = spec.cfg.run.global_rounds
    cfg = spec.cfg.model_copy(deep=True)
    cfg.run.eval_every = rounds  # one evaluation, at the end, of an untrained model: dropped
    fed = build_federation(cfg, eval_view(dataset, 16))
    result = SimulationEngine(fed, ScheduleOnlyExecutor(fed.client_samples)).run(on_round)
    for key in ("initial_accuracy", "final_accuracy", "best_accuracy"):
        result[key] = None
    for row in result["records"]:
        row["accuracy"] = row["loss"] = None
    result["schedule_only"] = True
    return result


class Runner:
    """Runs :class:`RunSpec` s over one loaded dataset, once each, with an optional disk cache.

    ``progress``: a ``rich.progress.Progress`` to show runs and rounds on (or None);
    ``fresh``: ignore (and overwrite) cached results; ``workers``: processes training a run's
    clients (None: one per core; results do not depend on it, so it is not in the cache key).
    """

    def __init__(self, dataset: Dataset, cache_dir: Path | None = None, *,
                 progress: Any = None, fresh: bool = False, workers: int | None = 1) -> None:
        self.dataset = dataset
        self.cache_dir = cache_dir
        self.progress = progress
        self.fresh = fresh
        self.workers = workers
        self.results: dict[str, dict[str, Any]] = {}
        self.cached_hits = 0
        self.simulated = 0
        self.wall_seconds = 0.0
        self._views: dict[int | None, Dataset] = {}

    def _path(self, spec: RunSpec) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{spec.key}.json.gz"

    def _load(self, spec: RunSpec) -> dict[str, Any] | None:
        p = self._path(spec)
        if p is None or self.fresh or not p.is_file():
            return None
        try:
            with gzip.open(p, "rt") as fh:
                return json.load(fh)
        except (OSError, ValueError) as err:
            log.warning("ignoring unreadable cached run %s: %s", p, err)
            return None

    def _store(self, spec: RunSpec, result: dict[str, Any]) -> None:
        p = self._path(spec)
        if p is None:
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        with gzip.open(tmp, "wt") as fh:
            json.dump(result, fh, separators=(",", ":"))
        tmp.replace(p)

    def _view(self, samples: int | None) -> Dataset:
        if samples not in self._views:
            self._views[samples] = eval_view(self.dataset, samples)
        return self._views[samples]

    def run_one(self, spec: RunSpec,
                on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The result of ``spec``: from memory, the cache, or a fresh simulation."""
        from fedcure_app.simulation.engine import simulate

        key = spec.key
        if key in self.results:
            return self.results[key]
        result = self._load(spec)
        if result is not None:
            self.cached_hits += 1
        else:
            t0 = time.perf_counter()
            if spec.schedule_only:
                result = _schedule_only(spec, self.dataset, on_round)
            else:
                result = simulate(spec.cfg, dataset=self._view(spec.eval_samples),
                                  on_round=on_round, workers=self.workers)
            self.wall_seconds += time.perf_counter() - t0
            self.simulated += 1
            result["label"] = spec.label
            self._store(spec, result)
        self.results[key] = result
        return result

    def run_all(self, specs: Iterable[RunSpec]) -> dict[str, dict[str, Any]]:
        """Run every distinct spec (by key); returns key -> result for all of them."""
        unique: dict[str, RunSpec] = {}
        for s in specs:
            unique.setdefault(s.key, s)
        todo = list(unique.values())
        prog = self.progress
        overall = None
        if prog is not None and todo:
            overall = prog.add_task(f"{self.dataset.name}: runs", total=len(todo), acc="")
        for spec in todo:
            rounds = spec.cfg.run.global_rounds
            bar = None
            if prog is not None:
                bar = prog.add_task(f"  {spec.label}", total=rounds, acc="-")

            def on_round(row: dict[str, Any], bar=bar) -> None:
                if prog is not None and bar is not None:
                    acc = row.get("accuracy")
                    fields = {"acc": f"{100 * acc:.1f}%"} if acc is not None else {}
                    prog.update(bar, completed=row["round"], **fields)

            self.run_one(spec, on_round)
            if prog is not None:
                if bar is not None:
                    prog.remove_task(bar)
                if overall is not None:
                    prog.advance(overall)
        if prog is not None and overall is not None:
            prog.remove_task(overall)
        return {k: self.results[k] for k in unique}


__all__ = ["RunSpec", "Runner", "ScheduleOnlyExecutor", "eval_view"]
