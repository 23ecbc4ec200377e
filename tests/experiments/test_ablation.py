"""``fedcure experiment ablation`` at the tiny budget, the dip measures, the runner's re-run of a
cached run that lacks diagnostics, and ``--cache-only``."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.cli import main
from fedcure_app.data import load_dataset
from fedcure_app.experiments import ablation
from fedcure_app.experiments.budget import base_config, get_budget
from fedcure_app.experiments.report import write_report
from fedcure_app.experiments.runner import MissingRun, Runner, RunSpec
from fedcure_app.experiments.suite import run_dataset


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One tiny ablation on digits (one torch thread, one process)."""
    import torch

    from fedcure_app import training

    threads, configured = torch.get_num_threads(), training._threads_configured
    out = tmp_path_factory.mktemp("ablation")
    try:
        rc = main(["experiment", "ablation", "--dataset", "digits", "--budget", "tiny",
                   "--out", str(out), "--no-progress", "--threads", "1", "--workers", "1"])
    finally:
        torch.set_num_threads(threads)
        training._threads_configured = configured
    assert rc == 0
    return out


def _summary(out):
    return json.loads((out / "digits" / "ablation" / "summary.json").read_text())


def test_every_variant_has_its_final_and_best_accuracy(out):
    data = _summary(out)["data"]
    assert list(data["variants"]) == [v.key for v in ablation.VARIANTS]
    assert len(data["variants"]) >= 8 and not data["pending"]
    for key, v in data["variants"].items():
        assert 0.0 <= v["final_accuracy"] <= v["best_accuracy"] <= 1.0, key
        assert v["curve"][-1][1] == v["final_accuracy"]


def test_each_variant_changes_only_its_knob(out):
    runs = {}
    for p in (out / "digits" / "runs").glob("*.json.gz"):
        r = json.loads(gzip.open(p, "rt").read())
        runs[p.name.split(".")[0]] = r["config"]["method"]
    data = _summary(out)["data"]["variants"]
    literal = runs[data["literal"]["key"]]
    for key, v in data.items():
        method = runs[v["key"]]
        changed = {k for k in method if method[k] != literal[k]}
        want = {k for k, val in v["overrides"].items() if literal.get(k) != val}
        assert changed == want, key
    assert runs[data["momentum"]["key"]]["momentum"] == 0.9
    assert runs[data["epoch"]["key"]]["tau-c-unit"] == "epochs"
    assert runs[data["ell"]["key"]]["ell"] == 0.5


def test_the_section_has_curves_per_class_plot_its_own_report_and_the_command(out):
    folder = out / "digits" / "ablation"
    s = _summary(out)
    assert {"accuracy.png", "dip_classes.png"} <= set(s["figures"])
    for f in s["figures"]:
        assert (folder / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (folder / "report.md").read_text()
    assert "fedcure experiment ablation --dataset digits --budget tiny" in report
    assert "--data-dir DIR" in report and "![accuracy](accuracy.png)" in report
    assert "recall at peak" in report or "no fall" in report.lower()
    assert s["data"]["dip"]["literal"]["classes"] is not None


def test_the_main_report_picks_up_an_ablation_run_earlier(out):
    o = run_dataset("digits", ["formation"], data_dir=None, budget="tiny", seeds=None, out=out)
    assert "ablation" in o.sections and o.sections["ablation"].figures
    path = write_report([o], out, command="fedcure experiment all", total_seconds=1.0)
    text = path.read_text()
    assert ablation.TITLE in text and "digits/ablation/accuracy.png" in text
    # another budget's ablation is not mixed in
    other = run_dataset("digits", ["formation"], data_dir=None, budget="quick", seeds=None,
                        out=out)
    assert "ablation" not in other.sections


def test_cache_only_simulates_nothing_and_lists_what_is_missing(tmp_path, capsys):
    rc = main(["experiment", "ablation", "--dataset", "digits", "--budget", "tiny",
               "--out", str(tmp_path), "--no-progress", "--cache-only"])
    assert rc == 0
    assert not list((tmp_path / "digits" / "runs").glob("*.json.gz"))
    data = _summary(tmp_path)["data"]
    assert data["pending"] == [v.key for v in ablation.VARIANTS] and not data["variants"]
    rc = main(["experiment", "table1", "--dataset", "digits", "--budget", "tiny",
               "--out", str(tmp_path), "--no-progress", "--cache-only"])
    assert rc == 2 and "is not in the cache" in capsys.readouterr().err
    assert main(["experiment", "ablation", "--budget", "tiny", "--out", str(tmp_path),
                 "--fresh", "--cache-only"]) == 2


def test_variants_simulates_only_the_named_ones_and_lists_the_rest(tmp_path, one_thread):
    rc = main(["experiment", "ablation", "--dataset", "digits", "--budget", "tiny",
               "--out", str(tmp_path), "--no-progress", "--workers", "1",
               "--variants", "lr,batch10"])
    assert rc == 0
    runs = list((tmp_path / "digits" / "runs").glob("*.json.gz"))
    assert len(runs) == 2
    assert all(json.loads(gzip.open(p, "rt").read())["device"] == "cpu" for p in runs)
    data = _summary(tmp_path)["data"]
    keys = {p.name.split(".")[0] for p in runs}
    # a variant is read when its run is one of the two (at the tiny budget the literal run may
    # share a key with one of them); every other one is listed as not run yet
    assert {"batch10", "lr"} <= set(data["variants"])
    assert all(v["key"] in keys for v in data["variants"].values())
    assert data["pending"] == [v.key for v in ablation.VARIANTS if v.key not in data["variants"]]
    assert "epoch" in data["pending"]


def test_variants_are_checked_and_belong_to_the_ablation(tmp_path, capsys):
    assert ablation.parse_variants("all") == [v.key for v in ablation.VARIANTS]
    assert ablation.parse_variants("epoch, lr,epoch") == ["epoch", "lr"]
    assert main(["experiment", "ablation", "--budget", "tiny", "--out", str(tmp_path),
                 "--variants", "lr,nesterov"]) == 2
    assert "unknown ablation variant 'nesterov'" in capsys.readouterr().err
    assert main(["experiment", "table1", "--budget", "tiny", "--out", str(tmp_path),
                 "--variants", "lr"]) == 2
    assert "--variants applies to" in capsys.readouterr().err
    assert not (tmp_path / "digits").exists()


def test_the_help_names_every_variant():
    import argparse

    from fedcure_app.cli.experiment import register

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    text = " ".join(sub.choices["experiment"].format_help().split())
    assert ", ".join(v.key for v in ablation.VARIANTS) in text


def test_a_cached_run_without_diagnostics_is_simulated_again_and_checked(tmp_path, one_thread):
    digits = load_dataset("digits")
    cfg = base_config("digits", None, get_budget("tiny", "digits"))
    spec = RunSpec("t", cfg)
    first = Runner(digits, tmp_path).run_one(spec)
    path = tmp_path / f"{spec.key}.json.gz"
    old = json.loads(gzip.open(path, "rt").read())
    for rec in old["records"]:
        del rec["confusion"]
    with gzip.open(path, "wt") as fh:
        json.dump(old, fh)
    needy = RunSpec("t", cfg, needs=("confusion",))
    assert needy.key == spec.key
    with pytest.raises(MissingRun):
        Runner(digits, tmp_path / "empty", cache_only=True).run_one(needy)
    # cache-only uses the result as it is
    assert "confusion" not in Runner(digits, tmp_path, cache_only=True).run_one(needy)["records"][0]
    runner = Runner(digits, tmp_path)
    assert runner.needs_simulation(needy) and not runner.needs_simulation(spec)
    again = runner.run_one(needy)
    assert runner.simulated == 1
    assert again["rerun_check"]["identical"] and again["records"] == first["records"]
    assert Runner(digits, tmp_path).needs_simulation(needy) is False


def _result(accs, losses=None, rounds_per_eval=5):
    losses = losses or [1.0 / (i + 1) for i in range(len(accs))]
    recs = [{"round": rounds_per_eval * (i + 1), "accuracy": a, "loss": l}
            for i, (a, l) in enumerate(zip(accs, losses))]
    return {"records": recs, "rounds": rounds_per_eval * len(accs)}


def test_find_dip_measures_the_deepest_fall_below_the_running_best():
    d = ablation.find_dip(_result([0.5, 0.8, 0.83, 0.81, 0.79, 0.80, 0.84, 0.9]))
    assert (d.peak_round, d.trough_round, d.recovered_round) == (15, 25, 35)
    assert d.depth == pytest.approx(0.04) and (d.loss_rises, d.steps) == (0, 2)
    assert ablation.find_dip(_result([0.1, 0.2, 0.3])) is None
    up = ablation.find_dip(_result([0.5, 0.4, 0.45], losses=[1.0, 1.2, 1.1]))
    assert (up.loss_rises, up.recovered_round) == (1, None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=30))
def test_find_dip_depth_is_the_maximum_drawdown(accs):
    d = ablation.find_dip(_result(accs))
    drawdown = max(max(accs[:j + 1]) - accs[j] for j in range(len(accs)))
    if drawdown == 0:
        assert d is None
    else:
        assert d.depth == pytest.approx(drawdown)
        assert d.peak_round < d.trough_round


def test_class_shift_reads_recall_and_predicted_share_from_the_confusion():
    peak = [[9, 1, 0], [0, 10, 0], [0, 0, 10]]
    trough = [[5, 0, 5], [0, 10, 0], [0, 0, 10]]
    result = {"records": [
        {"round": 5, "accuracy": 29 / 30, "loss": 1.0, "confusion": peak},
        {"round": 10, "accuracy": 25 / 30, "loss": 0.9, "confusion": trough}], "rounds": 10}
    d = ablation.find_dip(result)
    rows = ablation.class_shift(result, d)
    assert rows[0]["recall_peak"] == 0.9 and rows[0]["recall_trough"] == 0.5
    assert rows[0]["lost_to"] == 2
    assert rows[2]["predicted_trough"] == pytest.approx(15 / 30)
    assert np.isclose(sum(r["predicted_trough"] for r in rows), 1.0)


def test_a_reading_within_a_point_of_the_paper_reruns_table1s_formed_methods(
        out, monkeypatch, capsys):
    """With a (made-up) paper accuracy every variant reaches, the cheapest *reading* (not a
    departure such as lr 0.05) is run for FedGreedy, FedFair and FedCure over the seeds."""
    from types import MappingProxyType

    from fedcure_app.experiments.paper import PaperTable1

    fake = PaperTable1(
        accuracy=MappingProxyType({"digits": MappingProxyType(
            {m: (1.0, 0.1) for m in ("greedy", "fair", "fedgreedy", "fedfair", "fedcure")})}),
        cohens_d=MappingProxyType({"digits": 0.0}), names=MappingProxyType({"digits": "D"}),
        source="test")
    monkeypatch.setattr(ablation, "PAPER_TABLE1", fake)
    rc = main(["experiment", "ablation", "--dataset", "digits", "--budget", "tiny",
               "--out", str(out), "--no-progress", "--threads", "1", "--workers", "1"])
    assert rc == 0
    s = _summary(out)
    data = s["data"]
    variants = data["variants"]
    chosen = data["second_reading"]["variant"]
    assert variants[chosen]["reading"]
    readings = [k for k, v in variants.items() if v["reading"] and k != "literal"]
    assert chosen == min(readings, key=lambda k: variants[k]["wall_seconds"])
    for m in ablation.FORMED:
        got = data["second_reading"]["methods"][m]
        assert len(got["second"]) == 2 and got["missing"] == 0
    assert "second_reading.png" in s["figures"]
    assert "Table 1's formed methods at a second reading" in s["markdown"]
    assert "Within 1 point of the paper's 1.00 %" in s["markdown"]
    capsys.readouterr()


def _dip_data(staleness_during=2.0, jsd=0.0, loss_rises=0):
    sched = {"arrivals": 10, "staleness": 2.0, "xi": 0.18, "share": [0.5, 0.5]}
    classes = [
        {"class": 0, "recall_peak": 0.9, "recall_trough": 0.9, "predicted_peak": 0.45,
         "predicted_trough": 0.60, "lost_to": 1},
        {"class": 1, "recall_peak": 0.8, "recall_trough": 0.5, "predicted_peak": 0.55,
         "predicted_trough": 0.40, "lost_to": 0},
    ]
    return {"runs": [{"loss_rises": loss_rises, "steps": 2}], "literal": {
        "dip": {"peak_round": 25, "trough_round": 35, "depth": 0.05},
        "schedule": {"before": sched, "during": {**sched, "staleness": staleness_during},
                     "after": sched},
        "edge_distance": {"before": 1.0, "during": 1.1, "after": 1.0},
        "train_loss_first": {"before": 0.5, "during": 0.4, "after": 0.3},
        "classes": classes, "lr": 0.01, "formed_jsd": jsd}}


def test_the_dip_explanation_claims_only_what_the_numbers_show():
    calm = ablation.dip_explanation(_dip_data())
    assert "does not change when the fall starts" in calm and "JSD 0.0000" in calm
    assert "not diverging" in calm and "classes 1 (30.0 points, mostly to 0)" in calm
    assert "class 0 (45.00 → 60.00 %)" in calm
    moved = ablation.dip_explanation(_dip_data(staleness_during=3.0, jsd=0.2, loss_rises=1))
    assert "schedule shifts" in moved and "does not change" not in moved
    assert "JSD" not in moved and "not diverging" not in moved


def test_each_variant_reports_its_deepest_fall_and_a_gpu_run_says_so():
    lit = {"label": "literal", "dip": {"peak_round": 25, "peak": 0.83, "trough_round": 35,
                                       "trough": 0.79, "recovered_round": 55, "depth": 0.04}}
    flat = {"label": "momentum 0.9", "dip": None}
    text = ablation.variant_dips({"literal": lit, "momentum": flat})
    assert "literal: 4.00 points, round 25 → 35" in text and "momentum 0.9: never falls" in text
    assert ablation.variant_dips({}) == ""
    assert ablation.wall_cell({"wall_seconds": 116.4, "device": "cuda"}) == "116 (cuda)"
    assert ablation.wall_cell({"wall_seconds": 806.0}) == "806"
