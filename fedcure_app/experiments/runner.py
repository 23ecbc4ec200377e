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
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.data import Dataset
from fedcure_app.runtime.processes import alive
from fedcure_app.tasks import EdgeResult, EdgeTask

log = logging.getLogger(__name__)

#: Bump when the stored result format or its meaning changes (invalidates the cache).
CACHE_VERSION = 1

#: Every configuration field (section → field names) the schema had at cache version 1. These
#: always enter a run's key, as they did then; a field added since enters it only when set away
#: from its default (:func:`key_config`), so adding a knob keeps every cached run's key, and
#: setting it gives a new one. Never edit this: a new field is new by not being listed here.
V1_FIELDS: dict[str, frozenset[str]] = {
    "method": frozenset({"ell", "k", "beta", "kappa", "alpha", "gamma", "varsigma", "tau_c",
                         "tau_e", "lr", "batch_size", "max_concurrent", "formation",
                         "scheduler"}),
    "federation": frozenset({"num_clients", "num_edges", "num_classes"}),
    "data": frozenset({"dataset", "data_dir", "partition", "dirichlet_alpha",
                       "shards_per_client", "classes_per_edge"}),
    "run": frozenset({"global_rounds", "eval_every", "seed", "executor"}),
    "devices": frozenset({"mix", "profiles_file", "edge_link_mbps", "edge_access_mbps",
                          "calibrate_prior"}),
    "reliability": frozenset({"norm_factor", "norm_window", "norm_min_history",
                              "deadline_quantile", "deadline_slack", "deadline_min_s",
                              "first_deadline_s", "late_staleness_bound"}),
}

#: Fields that never change a run's result (where the files are, how the work is spread over
#: processes or devices): left out of the key whatever their value. A new field of that kind
#: belongs here.
RESULT_NEUTRAL: frozenset[tuple[str, str]] = frozenset({("data", "data_dir"),
                                                      ("run", "cuda_graphs")})


def key_config(cfg: FedCureConfig) -> dict[str, dict[str, Any]]:
    """The part of ``cfg`` a cached result depends on, as the cache key hashes it: every
    :data:`V1_FIELDS` field, and each newer field only where it differs from its default;
    :data:`RESULT_NEUTRAL` fields never."""
    dump = cfg.model_dump(mode="json")
    defaults = FedCureConfig().model_dump(mode="json")
    out: dict[str, dict[str, Any]] = {}
    for section, fields in dump.items():
        if not isinstance(fields, dict):  # an optional section (the task): only when set
            if fields != defaults.get(section):
                out[section] = fields
            continue
        v1 = V1_FIELDS.get(section, frozenset())
        for name, value in fields.items():
            if (section, name) in RESULT_NEUTRAL:
                continue
            if name in v1 or value != (defaults.get(section) or {}).get(name):
                out.setdefault(section, {})[name] = value
    for section in V1_FIELDS:  # a v1 section is in the key even if all of it were neutral
        out.setdefault(section, {})
    return out


@dataclass(frozen=True)
class RunSpec:
    """One simulation an experiment needs.

    ``eval_samples``: test samples evaluated (seeded subset; None = all);
    ``schedule_only``: no training (see module docstring); ``needs``: record fields the result
    must hold (diagnostics newer than a cached result, e.g. ``class_accuracy``): a cached
    result without them is simulated again, with the same key, and checked against the cached
    one (:meth:`Runner.run_one`). ``needs`` is not part of the key: it adds no result.
    """

    label: str
    cfg: FedCureConfig
    eval_samples: int | None = None
    schedule_only: bool = False
    needs: tuple[str, ...] = ()

    @property
    def own_data(self) -> bool:
        """The run reads a user's own folders, whose held-out part depends on the run's seed."""
        return self.cfg.task is not None and bool(self.cfg.data.clients_data)

    @property
    def key(self) -> str:
        """Content hash of what the result depends on (:func:`key_config`: the data directory
        and other result-neutral fields excluded, fields newer than cache version 1 only where
        set away from their defaults)."""
        own = {"split": "per-seed"} if self.own_data else {}  # not seed 0's for every seed
        blob = json.dumps({"v": CACHE_VERSION, "cfg": key_config(self.cfg),
                           "eval": self.eval_samples, "schedule_only": self.schedule_only,
                           **own}, sort_keys=True)
        return hashlib.blake2b(blob.encode(), digest_size=10).hexdigest()


class RunLock:
    """An exclusive claim on simulating one run: the file ``<cache entry>.lock`` holding the
    owner's PID, made with ``O_EXCL``. A lock whose owner is gone (a killed process) is taken
    over; one held by a live process is waited for (``waited`` is then True, and the caller
    reads the run the other process stored). Without a cache path it is a no-op."""

    POLL_S = 1.0

    def __init__(self, entry: Path | None) -> None:
        self.path = None if entry is None else entry.with_name(entry.name + ".lock")
        self.waited = False

    def _owner(self) -> int | None:
        try:
            return int(self.path.read_text().strip() or 0) or None  # type: ignore[union-attr]
        except (OSError, ValueError):
            return None

    def __enter__(self) -> RunLock:
        if self.path is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is None or not alive(owner):
                    log.info("taking over %s (its process %s is gone)", self.path.name, owner)
                    self.path.unlink(missing_ok=True)
                    continue
                if not self.waited:
                    log.info("waiting for process %d, which simulates %s", owner,
                             self.path.name)
                self.waited = True
                time.sleep(self.POLL_S)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return self

    def __exit__(self, *exc: object) -> None:
        if self.path is not None and self._owner() == os.getpid():
            self.path.unlink(missing_ok=True)


class MissingRun(ValueError):
    """A run the caller asked for is not in the cache and the runner may not simulate it."""


def holds(result: dict[str, Any], fields: Iterable[str]) -> bool:
    """Whether every record of ``result`` has every field of ``fields``."""
    fields = tuple(fields)
    return all(f in rec for rec in result.get("records", []) for f in fields)


def rerun_check(cached: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """How a re-simulated run compares with the cached result it replaces: whether every
    evaluation's accuracy and loss and every arrival's schedule (coalition, staleness, time)
    are the same, and the largest accuracy difference (fraction)."""
    old, new = cached.get("records", []), fresh.get("records", [])
    same_schedule = len(old) == len(new) and all(
        (a["coalition"], a["staleness"], a["time_s"]) == (b["coalition"], b["staleness"],
                                                        b["time_s"]) for a, b in zip(old, new))
    diffs = [abs(a["accuracy"] - b["accuracy"]) for a, b in zip(old, new)
             if a.get("accuracy") is not None and b.get("accuracy") is not None]
    same_eval = len(old) == len(new) and all(
        (a.get("accuracy"), a.get("loss")) == (b.get("accuracy"), b.get("loss"))
        for a, b in zip(old, new))
    return {"identical": bool(same_schedule and same_eval), "same_schedule": same_schedule,
            "max_accuracy_difference": max(diffs) if diffs else None,
            "cached_wall_seconds": cached.get("wall_seconds")}


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
        row["accuracy"] = row["loss"] = row["class_accuracy"] = row["confusion"] = None
    result["schedule_only"] = True
    return result


class Runner:
    """Runs :class:`RunSpec` s over one loaded dataset, once each, with an optional disk cache.

    ``progress``: a ``rich.progress.Progress`` to show runs and rounds on (or None);
    ``fresh``: ignore (and overwrite) cached results; ``workers``: processes training a run's
    clients (None: one per core; results do not depend on it, so it is not in the cache key);
    ``device``: where they train (likewise); ``cache_only``: never simulate — a run missing
    from the cache raises :class:`MissingRun` in :meth:`run_one` and is left out by
    :meth:`run_all` (a cached run lacking a spec's ``needs`` is used as it is); ``jobs``:
    distinct runs :meth:`run_all` simulates at once through ``parallel`` (each in a process of
    its own with one worker: :func:`.jobs.run_parallel`). A run is simulated under a lock file beside its cache entry, so
    two processes (or two commands on the same ``cache_dir``) never run or write the same run.
    """

    def __init__(self, dataset: Dataset, cache_dir: Path | None = None, *,
                 progress: Any = None, fresh: bool = False, workers: int | None = 1,
                 device: Any = "cpu", cache_only: bool = False, jobs: int = 1,
                 parallel: Callable[[Runner, list[RunSpec]], None] | None = None) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {jobs}")
        if jobs > 1 and parallel is None:
            raise ValueError("jobs > 1 needs a parallel driver (experiments.jobs.run_parallel)")
        self.dataset = dataset
        self.cache_dir = cache_dir
        self.progress = progress
        self.fresh = fresh
        self.workers = workers
        self.device = device
        self.cache_only = cache_only
        self.jobs = int(jobs)
        self.parallel = parallel
        self.results: dict[str, dict[str, Any]] = {}
        self.cached_hits = 0
        self.simulated = 0
        self.wall_seconds = 0.0
        self._views: dict[tuple[int | None, int | None], Dataset] = {}

    def _path(self, spec: RunSpec) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{spec.key}.json.gz"

    def _load(self, spec: RunSpec) -> dict[str, Any] | None:
        return None if self.fresh else self._read(spec)

    def _read(self, spec: RunSpec) -> dict[str, Any] | None:
        p = self._path(spec)
        if p is None or not p.is_file():
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

    def _view(self, spec: RunSpec) -> Dataset:
        """The data ``spec`` runs on, its test split cut to ``spec.eval_samples``: the loaded
        dataset, or for a user's own folders those folders read with the run's seed (each
        client's held-out part is drawn per seed, as ``fedcure simulate --seed`` draws it)."""
        seed = spec.cfg.run.seed if spec.own_data else None
        key = (seed, spec.eval_samples)
        if key not in self._views:
            data = self.dataset
            if seed is not None:
                from fedcure_app.data.own_federation import load_federation_data

                data = load_federation_data(spec.cfg)
            self._views[key] = eval_view(data, spec.eval_samples)
        return self._views[key]

    def peek(self, spec: RunSpec) -> dict[str, Any] | None:
        """The result of ``spec`` if it is in memory or in the cache, else None (never
        simulates)."""
        key = spec.key
        if key in self.results:
            return self.results[key]
        result = self._load(spec)
        if result is not None:
            self.cached_hits += 1
            self.results[key] = result
        return result

    def adopt(self, spec: RunSpec, seconds: float) -> None:
        """Take the result another process simulated for ``spec`` (in ``seconds``) and stored
        in the cache, counting it as simulated."""
        result = self._read(spec)
        if result is None:
            raise MissingRun(f"run {spec.label!r} was simulated but is not in the cache")
        self.results[spec.key] = result
        self.simulated += 1
        self.wall_seconds += seconds

    def needs_simulation(self, spec: RunSpec) -> bool:
        """Whether :meth:`run_one` would simulate ``spec`` (not cached, or lacking its
        ``needs``)."""
        cached = self.results.get(spec.key)
        if cached is None:
            cached = self._load(spec)
        return cached is None or (bool(spec.needs) and not holds(cached, spec.needs))

    def run_one(self, spec: RunSpec,
                on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The result of ``spec``: from memory, the cache, or a fresh simulation (also when the
        cached one lacks a field of ``spec.needs``: the fresh result replaces it, with a
        ``rerun_check`` against it)."""
        key = spec.key
        result = self.results.get(key)
        if result is None:
            result = self._load(spec)
        elif not spec.needs or holds(result, spec.needs) or self.cache_only:
            return result
        previous = None
        if (result is not None and spec.needs and not self.cache_only
                and not holds(result, spec.needs)):
            log.info("%s: cached without %s; simulating it again", spec.label,
                     ", ".join(spec.needs))
            previous, result = result, None
        if result is not None:
            self.cached_hits += 1
        elif self.cache_only:
            raise MissingRun(f"run {spec.label!r} is not in the cache"
                             f"{f' ({self.cache_dir})' if self.cache_dir else ''}")
        else:
            with RunLock(self._path(spec)):
                result = self._load(spec)  # another process may have stored it meanwhile
                if result is not None and (not spec.needs or holds(result, spec.needs)):
                    self.cached_hits += 1
                else:
                    result = self._simulate(spec, previous, on_round)
        self.results[key] = result
        return result

    def _simulate(self, spec: RunSpec, previous: dict[str, Any] | None,
                  on_round: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        """Simulate ``spec`` now and store it (``previous``: the cached result it replaces)."""
        from fedcure_app.simulation.engine import simulate

        t0 = time.perf_counter()
        if spec.schedule_only:
            result = _schedule_only(spec, self.dataset, on_round)
        else:
            result = simulate(spec.cfg, dataset=self._view(spec),
                              on_round=on_round, workers=self.workers, device=self.device)
        self.wall_seconds += time.perf_counter() - t0
        self.simulated += 1
        result["label"] = previous.get("label", spec.label) if previous else spec.label
        if previous is not None:
            result["rerun_check"] = rerun_check(previous, result)
            if not result["rerun_check"]["identical"]:
                log.warning("%s: the new simulation differs from the cached one: %s",
                            spec.label, result["rerun_check"])
        self._store(spec, result)
        return result

    def run_all(self, specs: Iterable[RunSpec]) -> dict[str, dict[str, Any]]:
        """Run every distinct spec (by key); returns key -> result for all of them."""
        unique: dict[str, RunSpec] = {}
        for s in specs:  # one run per key, needing what any of its specs needs
            first = unique.setdefault(s.key, s)
            if s.needs and not set(s.needs) <= set(first.needs):
                unique[s.key] = dataclasses.replace(
                    first, needs=tuple(dict.fromkeys(first.needs + s.needs)))
        todo = list(unique.values())
        if self.cache_only:
            todo = [s for s in todo if self.peek(s) is not None]
        if self.jobs > 1 and self.parallel is not None and not self.cache_only:
            pending = [s for s in todo if self.needs_simulation(s)]
            if len(pending) > 1:
                self.parallel(self, pending)
        prog = self.progress
        overall = None
        if prog is not None and todo:
            overall = prog.add_task(f"{self.dataset.name}: runs", total=len(todo), acc="")
        for spec in todo:
            rounds = spec.cfg.run.global_rounds
            bar = None
            if prog is not None:
                bar = prog.add_task(f"  {spec.label}", total=rounds, acc="-")

            started = time.perf_counter()
            every = max(1, rounds // 10)

            live = prog is not None and not getattr(prog, "disable", False)

            def on_round(row: dict[str, Any], bar=bar, label=spec.label, started=started,
                         every=every, rounds=rounds, live=live) -> None:
                acc = row.get("accuracy")
                if prog is not None and bar is not None:
                    fields = {"acc": f"{100 * acc:.1f}%"} if acc is not None else {}
                    prog.update(bar, completed=row["round"], **fields)
                if not live and row["round"] % every == 0:  # no live bar: a line per tenth
                    log.info("%s: round %d/%d%s, %.0f s", label, row["round"], rounds,
                             f", accuracy {100 * acc:.2f} %" if acc is not None else "",
                             time.perf_counter() - started)

            self.run_one(spec, on_round)
            if prog is not None:
                if bar is not None:
                    prog.remove_task(bar)
                if overall is not None:
                    prog.advance(overall)
        if prog is not None and overall is not None:
            prog.remove_task(overall)
        return {k: self.results[k] for k in unique if k in self.results}


__all__ = ["CACHE_VERSION", "RESULT_NEUTRAL", "V1_FIELDS", "MissingRun", "RunLock", "RunSpec",
           "Runner",
           "ScheduleOnlyExecutor", "eval_view", "holds", "key_config", "rerun_check"]
