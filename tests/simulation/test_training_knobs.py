"""The local-training knobs of the simulation (momentum, τ_c counted in epochs, the device) and
the per-round diagnostics of the engine's records."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcure_app.cli import main
from fedcure_app.config import ConfigError, FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.federation import build_strategy, samples_per_round, simulation_only_knobs
from fedcure_app.simulation.engine import (
    SimulationEngine,
    build_federation,
    make_executor,
    make_inprocess_executor,
)
from fedcure_app.tasks import EdgeTask

TINY = {
    "dataset": "digits", "num-clients": 9, "num-edges": 3, "global-rounds": 6,
    "tau-c": 2, "tau-e": 2, "eval-every": 3, "seed": 4, "lr": 0.05,
}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _fed(digits, **flat):
    return build_federation(apply_flat(FedCureConfig(), {**TINY, **flat}), digits)


def _task(fed, **kw) -> EdgeTask:
    m = fed.cfg.method
    base = dict(task_id="t", coalition=0, version=0, arrays=fed.initial_arrays,
                clients=tuple(fed.coalitions[0]), frequencies_ghz={}, tau_e=1, tau_c=m.tau_c,
                lr=m.lr, batch_size=m.batch_size, seed=1)
    return EdgeTask(**{**base, **kw})


def _run(fed, executor):
    try:
        return SimulationEngine(fed, executor).run()
    finally:
        executor.close()


def test_an_epoch_of_local_training_visits_each_clients_data_once(digits):
    fed = _fed(digits)
    ex = make_inprocess_executor(fed)
    res = ex.run(_task(fed, tau_c=1, tau_c_unit="epochs"))
    sizes = fed.client_samples
    assert [r.samples for r in res.reports] == [int(sizes[c]) for c in fed.coalitions[0]]
    steps = ex.run(_task(fed, tau_c=1))
    assert [r.samples for r in steps.reports] == [min(32, int(sizes[c]))
                                                 for c in fed.coalitions[0]]


def test_momentum_changes_the_edge_model_and_defaults_to_plain_sgd(digits):
    fed = _fed(digits)
    ex = make_inprocess_executor(fed)
    plain = ex.run(_task(fed))
    again = ex.run(_task(fed, momentum=0.0))
    heavy = ex.run(_task(fed, momentum=0.9))
    assert all(np.array_equal(a, b) for a, b in zip(plain.arrays, again.arrays))
    assert not all(np.array_equal(a, b) for a, b in zip(plain.arrays, heavy.arrays))


def test_unknown_tau_c_unit_is_refused():
    with pytest.raises(ConfigError):
        apply_flat(FedCureConfig(), {"tau-c-unit": "minutes"})
    with pytest.raises(ConfigError):
        apply_flat(FedCureConfig(), {"momentum": 1.0})
    with pytest.raises(ConfigError):
        apply_flat(FedCureConfig(), {"momentum": -0.1})


@pytest.mark.parametrize("workers", [2, 4])
def test_worker_processes_give_the_same_run_with_momentum_and_epochs(digits, workers):
    fed = _fed(digits, **{"momentum": 0.5, "tau-c": 1, "tau-c-unit": "epochs",
                          "batch-size": 16})
    seq = _run(fed, make_inprocess_executor(fed))
    par = _run(fed, make_executor(fed, workers))
    strip = ("wall_seconds",)
    assert {k: v for k, v in seq.items() if k not in strip} == \
        {k: v for k, v in par.items() if k not in strip}


def test_per_epoch_work_grows_with_the_clients_data(digits):
    steps = apply_flat(FedCureConfig(), {**TINY, "tau-c": 3, "batch-size": 8})
    epochs = apply_flat(steps, {"tau-c": 2, "tau-c-unit": "epochs"})
    n = np.array([10, 40, 25])
    assert samples_per_round(steps, n).tolist() == [24, 24, 24]
    assert samples_per_round(epochs, n).tolist() == [20, 80, 50]
    fed_s, fed_e = _fed(digits), _fed(digits, **{"tau-c": 1, "tau-c-unit": "epochs"})
    # c_n ∝ |D_n| under the epoch reading: the latency prior and the cycles follow the data
    ratio = fed_e.client_cycles() / fed_s.client_cycles()
    assert ratio == pytest.approx(fed_e.client_samples / (TINY["tau-c"] * 32))
    assert (fed_e.prior_latency() > fed_s.prior_latency()).all()


def test_the_deployed_cloud_refuses_the_simulation_only_knobs(digits):
    fed = _fed(digits, momentum=0.9)
    assert simulation_only_knobs(fed.cfg) == ["momentum"]
    with pytest.raises(ConfigError, match="momentum: simulation only"):
        build_strategy(fed.cfg, fed.coalitions, fed.client_samples, fed.population,
                       fed.prior_latency(), fed.initial_arrays, deployed=True)
    build_strategy(fed.cfg, fed.coalitions, fed.client_samples, fed.population,
                   fed.prior_latency(), fed.initial_arrays, deployed=False)
    assert _task(fed, tau_c_unit="epochs", momentum=0.1).simulation_only == [
        "momentum", "tau-c-unit"]
    assert _task(fed).simulation_only == []


def test_records_hold_the_confusion_counts_and_the_arrivals_diagnostics(digits):
    fed = _fed(digits)
    result = _run(fed, make_inprocess_executor(fed))
    classes = np.bincount(fed.dataset.y_test, minlength=10)
    for rec in result["records"]:
        assert rec["edge_distance"] > 0
        assert rec["train_loss_first"] > 0 and rec["train_loss_last"] > 0
        if rec["accuracy"] is None:
            assert rec["confusion"] is None and rec["class_accuracy"] is None
            continue
        conf = np.asarray(rec["confusion"])
        assert conf.sum(axis=1).tolist() == classes.tolist()
        assert np.trace(conf) / conf.sum() == pytest.approx(rec["accuracy"])
        assert rec["class_accuracy"] == pytest.approx((np.diag(conf) / classes).tolist())


def test_cpu_device_is_the_default_path_bit_for_bit(digits):
    fed = _fed(digits)
    a = _run(fed, make_inprocess_executor(fed))
    b = SimulationEngine(fed, make_inprocess_executor(fed, device="cpu"), device="cpu").run()
    assert a["records"] == b["records"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_device_cuda_without_a_gpu_is_a_one_line_usage_error(tmp_path, capsys):
    rc = main(["simulate", "--device", "cuda", "--rounds", "2", "--out", str(tmp_path / "o"),
               "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--device cuda: CUDA is not available" in err[0]
    assert not (tmp_path / "o").exists()
    rc = main(["experiment", "table1", "--device", "cuda", "--budget", "tiny",
               "--out", str(tmp_path / "e"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "CUDA is not available" in err[0]


def test_device_auto_runs_on_what_torch_has(tmp_path):
    rc = main(["simulate", "--device", "auto", "--clients", "6", "--edges", "2", "--rounds", "2",
               "--tau-e", "1", "--tau-c", "1", "--eval-every", "1", "--workers", "1",
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 0 and (tmp_path / "result.json").is_file()


def test_flower_executor_refuses_momentum_on_the_command_line(tmp_path, capsys):
    rc = main(["simulate", "--executor", "flower", "--momentum", "0.9",
               "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--momentum" in err[0]


def test_knob_options_show_their_defaults_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--momentum", "0.0"), ("--batch-size", "32"),
                          ("--tau-c-unit", "steps"), ("--ell", "0.2"), ("--device", "cpu")):
        tail = text.split(flag + " ")[-1] if flag + " " in text else text.split(flag)[-1]
        assert f"(default: {default})" in tail[:400], flag
