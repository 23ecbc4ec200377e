"""Many runs at once: ``fedcure experiment ... --jobs N``.

The distinct runs an experiment still needs go to a pool of N processes, each with one torch
thread (the thread policy) and one worker, training on the runner's device (on a GPU the N
processes share it). Each process simulates through its own
:class:`~fedcure_app.experiments.runner.Runner` on the same cache folder, so every finished run
is stored at once, atomically, under the run's lock (:class:`~.runner.RunLock`): two processes
never run or write the same run, and an interrupted command resumes from what was stored.

On the CPU the pool forks (the loaded dataset is inherited, not copied); with CUDA it spawns
(a CUDA context cannot cross a fork) and each process receives the dataset once.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fedcure_app.data import Dataset
    from fedcure_app.experiments.runner import Runner, RunSpec

log = logging.getLogger(__name__)

_JOB: dict[str, Any] = {}


def _init(dataset: Dataset, cache_dir: Any, device: str, threads: int, fresh: bool,
          log_level: int = logging.WARNING) -> None:
    """Runs once in each job process: the parent's log level (a spawned process starts without
    its handlers), the thread policy and a runner on the shared cache."""
    from fedcure_app.experiments.runner import Runner
    from fedcure_app.runtime.threads import apply_thread_policy

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    logging.basicConfig(level=log_level,  # no-op where handlers came with a fork
                        format="%(levelname)s %(name)s [job %(process)d]: %(message)s")
    apply_thread_policy(threads)
    _JOB["runner"] = Runner(dataset, cache_dir, workers=1, device=device, fresh=fresh)


def _run(spec: RunSpec) -> tuple[str, float | None, float]:
    """Simulate ``spec`` (or take it from the cache) in this job process; return its key, final
    accuracy and wall seconds."""
    t0 = time.perf_counter()
    result = _JOB["runner"].run_one(spec)
    return spec.key, result.get("final_accuracy"), time.perf_counter() - t0


def pool_context(device: Any) -> multiprocessing.context.BaseContext:
    """``fork`` for CPU runs (the dataset is inherited), ``spawn`` when they train on a GPU."""
    return multiprocessing.get_context("fork" if torch.device(device).type == "cpu"
                                       else "spawn")


def run_parallel(runner: Runner, specs: list[RunSpec]) -> None:
    """Simulate ``specs`` (distinct keys) in ``runner.jobs`` processes; their results land in
    the runner's cache and memory. Shows runs done / total with an ETA on the runner's
    progress (a line per finished run without one). Ctrl-C stops the processes; what was
    stored stays, and a rerun resumes."""
    from fedcure_app.runtime.threads import applied_threads

    if runner.cache_dir is None:
        raise ValueError("--jobs needs the run cache: the job processes hand their runs over "
                         "through it")
    jobs = min(runner.jobs, len(specs))
    threads = applied_threads() or 1
    prog = runner.progress
    bar = None
    if prog is not None:
        bar = prog.add_task(f"{runner.dataset.name}: runs in {jobs} processes",
                            total=len(specs), acc="")
    log.info("%d runs in %d processes × %d torch thread(s) on %s", len(specs), jobs, threads,
             runner.device)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=pool_context(runner.device),
                               initializer=_init,
                               initargs=(runner.dataset, runner.cache_dir, str(runner.device),
                                         threads, runner.fresh,
                                         logging.getLogger().getEffectiveLevel()))
    started = time.perf_counter()
    futures: dict[Future, RunSpec] = {pool.submit(_run, s): s for s in specs}
    done = 0
    try:
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                spec = futures[f]
                key, acc, seconds = f.result()
                done += 1
                runner.adopt(spec, seconds)
                elapsed = time.perf_counter() - started
                eta = elapsed / done * (len(specs) - done)
                if prog is not None and bar is not None:
                    prog.update(bar, completed=done,
                                acc=f"last: {spec.label}" + (
                                    f" {100 * acc:.2f}%" if acc is not None else ""))
                if prog is None or getattr(prog, "disable", False):
                    log.info("run %d/%d done: %s%s in %.0f s (ETA %.0f s)", done, len(specs),
                             spec.label,
                             f", final accuracy {100 * acc:.2f} %" if acc is not None else "",
                             seconds, eta)
    except BaseException:
        log.warning("stopping the %d job processes; finished runs stay in the cache", jobs)
        for f in futures:
            f.cancel()
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if prog is not None and bar is not None:
            prog.remove_task(bar)
    pool.shutdown(wait=True)


__all__ = ["pool_context", "run_parallel"]
