"""The report's Table 1 next to the paper's (issue 16): the paper's cells, the signed
difference per cell, the ordering checks, and datasets the paper does not report. Built from
made-up :class:`DatasetOutcome`s; no simulation runs."""

from __future__ import annotations

import pytest
from fedcure_app.experiments.base import Section
from fedcure_app.experiments.paper import PAPER_FIG3_RATIO, PAPER_TABLE1
from fedcure_app.experiments.report import _paper_section, _table1_combined, ordering_line
from fedcure_app.experiments.suite import ALL_DATASETS, DatasetOutcome
from fedcure_app.experiments.table1 import METHODS

#: Final accuracies (fractions) per method in the paper's MNIST order:
#: FedFair = FedCure > FedGreedy > Fair > Greedy (FedCure 96.00 ± 1.00 %).
PAPER_ORDER = {"greedy": [0.30, 0.32], "fair": [0.70, 0.72], "fedgreedy": [0.94, 0.95],
               "fedfair": [0.955, 0.965], "fedcure": [0.95, 0.97]}


def outcome(name: str, accuracy: dict[str, list[float]], d: float | None = 0.1
            ) -> DatasetOutcome:
    """A dataset outcome holding only a Table 1 section with these final accuracies."""
    data = {"final_accuracy": accuracy, "cohens_d_fedcure_vs_fedfair": d}
    return DatasetOutcome(name, sections={"table1": Section("table1", "Table 1", name, "",
                                                            data=data)})


def row(md: str, method: str) -> list[str]:
    """The cells of the combined table's row for ``method``."""
    line = next(x for x in md.splitlines() if x.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_paper_table1_is_complete_and_keyed_like_the_code():
    assert set(PAPER_TABLE1.accuracy) == set(PAPER_FIG3_RATIO) == set(PAPER_TABLE1.cohens_d)
    assert set(PAPER_TABLE1.accuracy) <= set(ALL_DATASETS)
    for cells in PAPER_TABLE1.accuracy.values():
        assert set(cells) == set(METHODS)
    assert PAPER_TABLE1.accuracy["mnist"]["fedcure"] == (96.37, 0.05)
    assert PAPER_TABLE1.accuracy["cinic10"]["greedy"] == (14.56, 1.84)
    assert PAPER_TABLE1.cohens_d["svhn"] == 0.78 and PAPER_FIG3_RATIO["cifar10"] == 3.09
    assert "Table 1" in PAPER_TABLE1.source and "2511.10227" in PAPER_TABLE1.source


def test_combined_table_puts_the_paper_cell_next_to_ours_with_the_signed_difference():
    md = _table1_combined([outcome("mnist", PAPER_ORDER, d=0.0)])
    header = row(md, "method")
    assert header == ["method", "mnist (ours)", "MNIST (paper)", "mnist: ours − paper"]
    assert row(md, "FedCure") == ["FedCure", "96.00 ± 1.41", "96.37 ± 0.05", "-0.37"]
    assert row(md, "Greedy")[1:] == ["31.00 ± 1.41", "37.97 ± 0.03", "-6.97"]
    assert row(md, "Fair")[3] == "-5.19"
    # the paper's d is unsigned: compared as a magnitude
    assert row(md, "Cohen's d (FedCure vs FedFair)")[1:] == ["+0.00", "0.00", "+0.00 (magnitude)"]
    assert "could not be retrieved" not in md


def test_ordering_line_holds_for_the_papers_order():
    md = _table1_combined([outcome("mnist", PAPER_ORDER)])
    line = next(x for x in md.splitlines() if x.startswith("- **mnist**"))
    assert "above both Greedy and Fair: holds" in line
    assert "(FedFair = FedCure > FedGreedy > Fair > Greedy): holds" in line


def test_ordering_line_names_the_swapped_pair():
    # CIFAR-10: the paper has FedFair > FedCure > FedGreedy > Fair > Greedy; swap Fair/Greedy
    paper = {m: mu for m, (mu, _) in PAPER_TABLE1.accuracy["cifar10"].items()}
    ours = dict(paper, greedy=20.0, fair=19.0)
    line = ordering_line("cifar10", ours, paper)
    assert "above both Greedy and Fair: holds" in line
    assert "does not hold (swapped: Fair/Greedy)" in line
    # a formed variant below a plain one breaks (a) and swaps that pair in (b)
    ours = dict(paper, fedgreedy=10.0)
    line = ordering_line("cifar10", ours, paper)
    assert "Fair: does not hold (FedGreedy ≤ Greedy, FedGreedy ≤ Fair)" in line
    assert "swapped: FedGreedy/Greedy, FedGreedy/Fair" in line


def test_digits_has_no_paper_column_and_says_so():
    md = _table1_combined([outcome("digits", PAPER_ORDER), outcome("mnist", PAPER_ORDER)])
    assert row(md, "method") == ["method", "digits (ours)", "mnist (ours)", "MNIST (paper)",
                                 "mnist: ours − paper"]
    assert "The paper has no digits column, so digits shows our numbers only." in md
    assert "- **digits**" not in md
    assert "Not run here, so not shown: the paper's CIFAR-10, SVHN, CINIC-10 column(s)." in md
    only = _table1_combined([outcome("digits", PAPER_ORDER, d=None)])
    assert row(only, "method") == ["method", "digits (ours)"]
    assert "(paper)" not in only and row(only, "Cohen's d (FedCure vs FedFair)")[1] == "n/a"


def test_paper_section_cites_table1_and_skips_datasets_without_table1():
    md = _paper_section([outcome("mnist", PAPER_ORDER), DatasetOutcome("svhn")])
    assert "96.37 ± 0.05" in md and "arXiv:2511.10227, Table 1" in md
    assert "SVHN (paper)" not in md
    assert _table1_combined([DatasetOutcome("mnist")]) == "_Table 1 was not run._"


def test_cov_ordering_names_every_pair_that_breaks_the_papers_fig4a_order():
    from fedcure_app.experiments.efficiency import cov_ordering

    good = {"greedy": 0.09, "fedgreedy": 0.13, "fedcure": 0.1, "fedfair": 0.27, "fair": 0.26}
    assert cov_ordering(good) == "holds"
    bad = {**good, "fedcure": 0.28}
    assert cov_ordering(bad) == "does not hold (FedCure ≥ FedFair, FedCure ≥ Fair)"


def test_coalition_speed_spread_is_slowest_over_fastest_mean_task_latency():
    from fedcure_app.experiments.efficiency import coalition_speed_spread

    recs = [{"coalition": 0, "latency_s": 1.0}, {"coalition": 1, "latency_s": 3.0},
            {"coalition": 0, "latency_s": 3.0}, {"coalition": 1, "latency_s": 5.0}]
    assert coalition_speed_spread({"records": recs}) == pytest.approx(2.0)


def test_late_gain_is_the_accuracy_won_over_the_last_tenth_of_the_rounds():
    from fedcure_app.experiments.table1 import late_gain

    recs = [{"round": r, "accuracy": a} for r, a in
            [(1, None), (5, 0.5), (85, 0.80), (90, 0.85), (95, None), (100, 0.9)]]
    assert late_gain({"rounds": 100, "records": recs}) == pytest.approx(0.05)
    assert late_gain({"rounds": 100, "records": [{"round": 1, "accuracy": None}]}) == 0.0


def test_formed_gap_reason_compares_fedcures_margin_with_the_measured_seed_spread():
    from fedcure_app.experiments.report import _formed_gap_reason

    # FedCure 96.0 vs FedFair 96.0: margin 0, FedCure's std (1.41) is the largest of the three
    text = _formed_gap_reason(PAPER_ORDER, margin=0.0)
    assert "+25.0 points over the better of Greedy and Fair" in text
    assert "is within the seed-to-seed spread (largest std among them 1.41 points, 2 seeds)" in text
    assert "larger than" in _formed_gap_reason(PAPER_ORDER, margin=-2.0)
    one_seed = {m: v[:1] for m, v in PAPER_ORDER.items()}
    assert "no spread" in _formed_gap_reason(one_seed, margin=1.0)


def test_differences_note_mentions_digits_only_when_digits_was_run():
    from fedcure_app.experiments.report import _differences_note

    assert "scikit-learn's 8×8 digits" not in _differences_note([outcome("mnist", PAPER_ORDER)])
    assert "scikit-learn's 8×8 digits" in _differences_note([outcome("digits", PAPER_ORDER)])


def _sched_result(rows, rounds, beta=0.5):
    return {"config": {"method": {"beta": beta}}, "records": rows,
            "participation": {"rounds": rounds}}


def test_decisions_count_which_rule_the_pick_agrees_with():
    from fedcure_app.experiments.efficiency import decisions

    rows = [  # picks: longest queue (0), fastest (2), both (1); one without a choice
        {"candidates": [0, 2], "dispatched": [0], "queues_before": [0.8, 0.0, 0.2],
         "estimates_s": [20.0, 10.0, 10.0]},
        {"candidates": [0, 2], "dispatched": [2], "queues_before": [0.4, 0.0, 0.2],
         "estimates_s": [20.0, 10.0, 10.0]},
        {"candidates": [1, 2], "dispatched": [1], "queues_before": [0.0, 0.6, 0.2],
         "estimates_s": [20.0, 10.0, 12.0]},
        {"candidates": [1], "dispatched": [1], "queues_before": [0.0, 0.6, 0.2],
         "estimates_s": [20.0, 10.0, 12.0]},
    ]
    d = decisions(_sched_result(rows, [1, 1, 1]))
    assert d["decisions"] == 3
    assert d["longest_queue"] == pytest.approx(2 / 3) and d["fastest"] == pytest.approx(2 / 3)
    # first decision: queue spread 0.6, latency-term spread 0.5·(20 − 10)/(40/3)
    first = 0.6 / (0.5 * 10 / (40 / 3))
    assert d["queue_over_latency_spread"] == pytest.approx(
        sorted([first, 0.2 / (0.5 * 10 / (40 / 3)), 0.4 / (0.5 * 2 / 14)])[1])
    assert decisions(_sched_result([{"dispatched": [0]}], [1]))["decisions"] == 0


def test_slow_share_is_the_slower_halfs_share_of_the_rounds():
    from fedcure_app.experiments.efficiency import slow_share

    rows = [{"coalition": c, "latency_s": t} for c, t in
            [(0, 10.0), (1, 30.0), (2, 20.0), (0, 10.0), (2, 22.0), (3, 5.0)]]
    # slower half (⌊4/2⌋ = 2): coalitions 1 and 2 → 3 of 6 rounds
    assert slow_share(_sched_result(rows, [2, 1, 2, 1])) == pytest.approx(0.5)
    # a coalition that never arrived counts as slowest, with no rounds
    assert slow_share(_sched_result(rows, [2, 1, 2, 1, 0])) == pytest.approx(1 / 6)
