"""The parallel executor (worker processes) against the sequential one, and the thread policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcure_app.cli import main
from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.simulation.engine import (
    SimulationEngine,
    build_federation,
    client_tensors,
    make_executor,
    make_inprocess_executor,
)
from fedcure_app.simulation.executors import (
    InProcessExecutor,
    ParallelExecutor,
    _chunks,
    resolve_workers,
)
from fedcure_app.tasks import EdgeTask
from fedcure_app.runtime.threads import DEFAULT_THREADS, ENV_VAR, available_cores, policy_threads

TINY = {
    "dataset": "digits", "num-clients": 9, "num-edges": 3, "global-rounds": 6,
    "tau-c": 2, "tau-e": 2, "eval-every": 3, "seed": 4, "lr": 0.05,
}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="module")
def federation(digits):
    return build_federation(apply_flat(FedCureConfig(), TINY), digits)


def _run(federation, executor):
    engine = SimulationEngine(federation, executor)
    try:
        result = engine.run()
    finally:
        executor.close()
    return result, engine.strategy.global_arrays


# 2 workers: max-concurrent (2 of 3 coalitions) >= workers, so whole tasks train side by side
# (ParallelExecutor.submit); 4 workers: each edge round's clients are split over the workers
@pytest.mark.parametrize("workers", [2, 4])
def test_parallel_executor_gives_bit_identical_records_and_final_model(federation, workers):
    seq, seq_model = _run(federation, make_inprocess_executor(federation))
    par_ex = make_executor(federation, workers)
    assert isinstance(par_ex, ParallelExecutor) and par_ex.workers == workers
    par, par_model = _run(federation, par_ex)
    assert par["records"] == seq["records"]  # schedule, clock, accuracies, losses: exact
    assert par["final_accuracy"] == seq["final_accuracy"]
    assert len(par_model) == len(seq_model)
    for a, b in zip(seq_model, par_model):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_parallel_edge_task_matches_sequential_reports_and_weights(federation):
    ds = federation.dataset
    data = client_tensors(federation)
    clients = tuple(range(7))  # more clients than workers, uneven chunks
    task = EdgeTask(task_id="t", coalition=0, version=0, arrays=federation.initial_arrays,
                    clients=clients, frequencies_ghz={c: 1.0 + c / 10 for c in clients},
                    tau_e=3, tau_c=2, lr=0.05, batch_size=8, seed=11)
    a = InProcessExecutor(ds.name, ds.num_classes, data).run(task)
    par = ParallelExecutor(ds.name, ds.num_classes, data, 3)
    try:
        b = par.run(task)
        whole = par.submit(task).result()  # the whole task in one worker
        # the workers run the thread policy of this process (tests: 1 thread)
        assert par._pool.submit(torch.get_num_threads).result() == torch.get_num_threads()
    finally:
        par.close()
    strip = lambda r: (r.client, r.edge_round, r.samples, r.f_applied_ghz, r.loss)  # noqa: E731
    for got in (b, whole):
        assert [strip(r) for r in got.reports] == [strip(r) for r in a.reports]
        assert got.num_samples == a.num_samples
        assert all(np.array_equal(x, y) for x, y in zip(a.arrays, got.arrays))


def test_chunks_are_contiguous_near_equal_and_keep_order():
    items = list(range(10))
    for parts in (1, 2, 3, 4, 10, 16):
        ch = _chunks(items, parts)
        assert [x for c in ch for x in c] == items
        assert len(ch) <= parts
        assert max(map(len, ch)) - min(map(len, ch)) <= max(1, len(ch[0]) - 1)
    assert _chunks([], 3) == []


def test_workers_default_to_the_cores_and_reject_nonpositive():
    assert resolve_workers(None) == available_cores()
    assert resolve_workers(3) == 3
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        resolve_workers(0)


def test_thread_policy_is_one_thread_unless_env_or_option_says(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert DEFAULT_THREADS == 1
    assert policy_threads() == (1, "default")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert policy_threads() == (3, "$OMP_NUM_THREADS")
    monkeypatch.setenv(ENV_VAR, "2")
    assert policy_threads() == (2, f"${ENV_VAR}")
    assert policy_threads(5) == (5, "--threads")
    monkeypatch.setenv(ENV_VAR, "two")
    with pytest.raises(ValueError, match=ENV_VAR):
        policy_threads()
    with pytest.raises(ValueError, match=">= 1"):
        policy_threads(0)


def test_simulate_cli_takes_lr_workers_and_threads(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "--dataset", "digits", "--clients", "6", "--edges", "2",
               "--rounds", "2", "--tau-c", "1", "--tau-e", "1", "--lr", "0.2",
               "--workers", "2", "--threads", "1", "--out", str(out), "--no-progress"])
    assert rc == 0
    res = json.loads((out / "result.json").read_text())
    assert res["config"]["method"]["lr"] == 0.2 and res["rounds"] == 2
    assert torch.get_num_threads() == 1
    assert main(["simulate", "--workers", "0", "--out", str(out), "--no-progress"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_evaluation_split_over_workers_equals_evaluate(federation):
    from fedcure_app.models import build_model, set_weights
    from fedcure_app.training import evaluate

    ds = federation.dataset
    par = make_executor(federation, 3)
    try:
        for bs in (256, 7):
            acc, loss, confusion = par.evaluate_global(federation.initial_arrays, batch_size=bs)
            model = build_model(ds.name, ds.num_classes)
            set_weights(model, federation.initial_arrays)
            ref = evaluate(model, torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test),
                           batch_size=bs)
            assert (acc, loss) == (ref.accuracy, ref.loss)
            assert [tuple(row) for row in confusion.tolist()] == list(ref.confusion)
    finally:
        par.close()
