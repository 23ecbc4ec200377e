"""Readings of the paper's setting (``--reading``), many runs at once (``--jobs``) sharing one run
cache, the batched executor in experiments, and the run lock."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from fedcure_app.cli import main
from fedcure_app.data import load_dataset
from fedcure_app.experiments.budget import base_config, get_budget
from fedcure_app.experiments.jobs import run_parallel
from fedcure_app.experiments.readings import LITERAL, READINGS, get_reading, section_key
from fedcure_app.experiments.report import write_report
from fedcure_app.experiments.runner import Runner, RunLock, RunSpec
from fedcure_app.experiments.suite import run_dataset


def _configs(folder):
    out = {}
    for p in folder.glob("*.json.gz"):
        with gzip.open(p, "rt") as fh:
            out[p.name.split(".")[0]] = json.load(fh)
    return out


@pytest.fixture(scope="module")
def both_readings(tmp_path_factory):
    """Table 1 at the tiny budget on digits, literal then momentum (with --jobs 2), one cache."""
    import torch

    from fedcure_app import training

    threads, configured = torch.get_num_threads(), training._threads_configured
    out = tmp_path_factory.mktemp("readings")
    common = ["--dataset", "digits", "--budget", "tiny", "--out", str(out), "--no-progress",
              "--threads", "1", "--workers", "1"]
    try:
        assert main(["experiment", "table1", *common]) == 0
        assert main(["experiment", "all", *common, "--reading", "momentum", "--jobs", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
        training._threads_configured = configured
    return out


def test_readings_are_named_in_one_place_with_what_they_change():
    assert list(READINGS)[0] == LITERAL and dict(READINGS[LITERAL].flat) == {}
    assert dict(READINGS["momentum"].flat) == {"momentum": 0.9}
    assert all(r.why for r in READINGS.values())
    assert section_key("table1", "momentum") == "table1-momentum"
    assert section_key("table1", LITERAL) == "table1"
    with pytest.raises(ValueError, match="unknown reading 'adam'; choose from literal"):
        get_reading("adam")


def test_a_reading_writes_its_own_summary_with_table1s_schema(both_readings):
    lit = json.loads((both_readings / "digits" / "table1" / "summary.json").read_text())
    mom = json.loads((both_readings / "digits" / "table1-momentum" / "summary.json").read_text())
    assert lit["reading"] == LITERAL and mom["reading"] == "momentum"
    assert set(mom["data"]) == set(lit["data"])
    seeds = get_budget("tiny", "digits").seeds
    for m in ("greedy", "fair", "fedgreedy", "fedfair", "fedcure"):
        assert len(mom["data"]["final_accuracy"][m]) == seeds
        assert all(0.0 <= a <= 1.0 for a in mom["data"]["final_accuracy"][m])


def test_momentum_runs_differ_from_literal_ones_only_in_momentum(both_readings):
    runs = _configs(both_readings / "digits" / "runs")
    trained = [r for r in runs.values() if not r.get("schedule_only")]
    momenta = sorted({r["config"]["method"]["momentum"] for r in trained})
    assert momenta == [0.0, 0.9]
    lit = {(r["config"]["method"]["formation"], r["config"]["method"]["scheduler"],
            r["config"]["run"]["seed"]) for r in trained
           if r["config"]["method"]["momentum"] == 0.0}
    mom = {(r["config"]["method"]["formation"], r["config"]["method"]["scheduler"],
            r["config"]["run"]["seed"]) for r in trained
           if r["config"]["method"]["momentum"] == 0.9}
    assert lit <= mom  # every literal Table 1 run has its momentum twin


def test_the_report_shows_both_readings_beside_the_paper(both_readings):
    report = (both_readings / "report.md").read_text()
    assert "digits (ours)" in report and "digits · momentum (ours)" in report
    assert "**momentum** (momentum 0.9)" in report
    assert "reading: momentum 0.9" in report
    assert "--reading momentum" in report and "--jobs 2" in report


def test_a_second_command_takes_every_run_from_the_cache(both_readings, capsys):
    rc = main(["experiment", "table1", "--dataset", "digits", "--budget", "tiny", "--out",
               str(both_readings), "--no-progress", "--threads", "1", "--reading", "momentum",
               "--jobs", "2"])
    assert rc == 0
    assert "(0 runs simulated" in capsys.readouterr().err


def test_jobs_give_the_same_results_as_one_process(tmp_path, one_thread):
    ds = load_dataset("digits")
    b = get_budget("tiny", "digits", seeds=2)
    specs = [RunSpec(f"s{s}", base_config("digits", None, b).model_copy(
        update={"run": base_config("digits", None, b).run.model_copy(update={"seed": s})}),
        eval_samples=b.eval_samples) for s in range(3)]
    one = Runner(ds, tmp_path / "one").run_all(specs)
    many = Runner(ds, tmp_path / "many", jobs=2, parallel=run_parallel).run_all(specs)
    assert set(one) == set(many)
    for key in one:
        assert one[key]["records"] == many[key]["records"]
    assert not list((tmp_path / "many").glob("*.lock"))
    assert len(list((tmp_path / "many").glob("*.json.gz"))) == 3


def test_a_lock_of_a_dead_process_is_taken_over(tmp_path):
    entry = tmp_path / "abc.json.gz"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "abc.json.gz.lock").write_text(dead)
    with RunLock(entry) as lock:
        assert not lock.waited
        assert (tmp_path / "abc.json.gz.lock").read_text() == str(os.getpid())
    assert not (tmp_path / "abc.json.gz.lock").exists()


def test_a_lock_held_by_a_live_process_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(RunLock, "POLL_S", 0.05)
    entry = tmp_path / "abc.json.gz"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / "abc.json.gz.lock").write_text(str(holder.pid))
        threading.Timer(0.4, lambda: (tmp_path / "abc.json.gz.lock").unlink()).start()
        t0 = time.perf_counter()
        with RunLock(entry) as lock:
            assert lock.waited and time.perf_counter() - t0 >= 0.3
    finally:
        holder.kill()
        holder.wait()


def test_the_batched_executor_is_a_run_of_its_own_in_the_cache(tmp_path, one_thread):
    o = run_dataset("digits", ["table1"], data_dir=None, budget="tiny", seeds=1,
                    out=tmp_path, executor="batched")
    assert o.sections["table1"].data["final_accuracy"]["fedcure"]
    runs = _configs(tmp_path / "digits" / "runs")
    assert {r["config"]["run"]["executor"] for r in runs.values()} == {"batched"}


def test_reading_and_jobs_are_checked_before_anything_runs(tmp_path, capsys):
    rc = main(["experiment", "ablation", "--budget", "tiny", "--reading", "momentum",
               "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "--reading: the ablation varies one knob" in capsys.readouterr().err
    rc = main(["experiment", "table1", "--budget", "tiny", "--jobs", "0",
               "--out", str(tmp_path / "y")])
    assert rc == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_write_report_without_a_second_reading_has_no_readings_note(tmp_path, one_thread):
    o = run_dataset("digits", ["table1"], data_dir=None, budget="tiny", seeds=1, out=tmp_path)
    path = write_report([o], tmp_path, command="fedcure experiment all", total_seconds=1.0)
    assert "Readings of the paper's setting" not in path.read_text()


def _job_log_level() -> int:
    import logging

    return logging.getLogger().getEffectiveLevel()


def test_a_spawned_job_process_logs_at_the_parents_level(tmp_path):
    # on a GPU the job processes are spawned: without the parent's level their INFO lines (the
    # batched executor's choice of convolution path, say) would be dropped under -v
    import logging
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from fedcure_app.experiments.jobs import _init

    ds = load_dataset("digits")
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_init,
                             initargs=(ds, tmp_path, "cpu", 1, False, logging.INFO)) as pool:
        assert pool.submit(_job_log_level).result(timeout=120) == logging.INFO
