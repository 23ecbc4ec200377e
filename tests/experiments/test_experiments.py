"""Every experiment at the tiny budget on digits, through ``fedcure experiment all``: the outputs
exist and are sane, a missing dataset is skipped with a line in the report, the report embeds
every figure."""

from __future__ import annotations

import json
import math
import re

import pytest

from fedcure_app.cli import main
from fedcure_app.experiments import NAMES
from fedcure_app.experiments.table1 import METHODS


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One tiny ``all`` run (one torch thread: much faster on a busy 2-core box); the thread
    setting is restored afterwards so other tests see the process default."""
    import torch

    from fedcure_app import training

    threads, configured = torch.get_num_threads(), training._threads_configured
    out = tmp_path_factory.mktemp("experiments")
    empty = tmp_path_factory.mktemp("no-data")
    try:
        rc = main(["experiment", "all", "--dataset", "digits,cifar10", "--data-dir", str(empty),
                   "--budget", "tiny", "--out", str(out), "--no-progress", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
        training._threads_configured = configured
    assert rc == 0
    return out


def summary(out, name):
    return json.loads((out / "digits" / name / "summary.json").read_text())


def test_every_experiment_writes_its_pngs_and_summary(out):
    for name in NAMES:
        s = summary(out, name)
        assert s["figures"], name
        for fig in s["figures"]:
            data = (out / "digits" / name / fig).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, (name, fig)


def test_formation_lowers_the_jsd_from_ln2_and_ends_stable(out):
    d = summary(out, "formation")["data"]
    assert d["main"]["initial_jsd"] == pytest.approx(math.log(2), abs=1e-6)
    assert d["main"]["final_jsd"] < d["main"]["initial_jsd"] - 0.1
    assert d["main"]["stable"]
    traj = d["small"]["fedcure"]["jsd_trajectory"]
    assert all(b < a for a, b in zip(traj, traj[1:]))  # every accepted move lowers the JSD
    assert d["small"]["fedcure"]["final_jsd"] <= d["small"]["selfish"]["final_jsd"]


def test_table1_has_every_method_and_seed_and_a_cohens_d(out):
    d = summary(out, "table1")["data"]
    assert set(d["final_accuracy"]) == set(METHODS)
    for accs in d["final_accuracy"].values():
        assert len(accs) == 2 and all(0.0 <= a <= 1.0 for a in accs)
    assert d["cohens_d_fedcure_vs_fedfair"] is not None
    for m in ("fedgreedy", "fedfair", "fedcure"):
        assert max(d["formed_jsd"][m]) < min(d["formed_jsd"]["greedy"])
    md = summary(out, "table1")["markdown"]
    assert "FedCure" in md and "Cohen's d" in md and "±" in md


def test_clustering_and_rh_compare_formations_under_fedcure_scheduling(out):
    c = summary(out, "clustering")["data"]
    assert set(c["final_accuracy"]) == {"none", "kmeans", "meanshift", "fedcure"}
    assert c["formed_jsd"]["fedcure"][0] < c["formed_jsd"]["none"][0]
    r = summary(out, "rh")["data"]
    assert set(r["final_accuracy"]) == {"selfish", "fedcure"}
    assert math.isfinite(r["gap_points"])


def test_efficiency_keeps_long_term_balance_for_every_beta(out):
    d = summary(out, "efficiency")["data"]
    assert set(d["latency_cov"]) == set(METHODS)
    assert all(c > 0 for covs in d["latency_cov"].values() for c in covs)
    for beta, row in d["beta"].items():
        assert row["min_share_over_delta"] > 0.5, beta
        assert row["max_queue_over_T"] < 0.25, beta
    # the queue-less Greedy rule starves some coalition; the queue-based ones do not
    greedy = min(b["min_share_over_delta"] for b in d["balance"]["greedy"])
    fair = min(b["min_share_over_delta"] for b in d["balance"]["fair"])
    assert fair > greedy


def test_report_skips_the_missing_dataset_and_embeds_every_figure(out):
    report = (out / "report.md").read_text()
    assert "**cifar10**" in report and "cifar-10-python.tar.gz" in report
    assert "Cohen's d (FedCure vs FedFair)" in report and "0.0223" in report
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", report)
    assert len(links) == sum(len(summary(out, n)["figures"]) for n in NAMES)
    assert all((out / link).is_file() for link in links)
    assert "fedcure experiment all --dataset digits,cifar10" in report and "--threads 1" in report


def test_second_invocation_reuses_the_cached_runs(out, capsys):
    rc = main(["experiment", "table1", "--dataset", "digits", "--budget", "tiny",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    assert "0 runs simulated, 10 from cache" in capsys.readouterr().err


def test_bad_input_is_one_line_error(tmp_path, capsys):
    assert main(["experiment", "table1", "--dataset", "imagenet", "--out", str(tmp_path)]) == 2
    assert "unknown dataset 'imagenet'" in capsys.readouterr().err
    assert main(["experiment", "all", "--dataset", "cifar10", "--data-dir", str(tmp_path),
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "no dataset could be loaded" in capsys.readouterr().err


def test_efficiency_has_a_kappa_sweep_with_what_decided_each_pick(out):
    d = summary(out, "efficiency")["data"]
    assert set(d["kappa"]) == {"1", "0.5"}
    for k, row in d["kappa"].items():
        assert len(row["latency_cov"]) == 2 and all(c > 0 for c in row["latency_cov"])
        for dec in row["decisions"]:
            assert dec["decisions"] > 0, k
            assert 0.0 <= dec["longest_queue"] <= 1.0 and 0.0 <= dec["fastest"] <= 1.0
        assert all(0.0 <= s <= 1.0 for s in row["slow_share"])
    # κ = 1 is the FedCure COV runs themselves
    assert d["kappa"]["1"]["latency_cov"] == d["latency_cov"]["fedcure"]
    assert (out / "digits" / "efficiency" / "latency_cov_kappa.png").is_file()
