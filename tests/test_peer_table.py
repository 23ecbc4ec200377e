"""Time to target read off FedCure's and a peer's runs the same way
(fedcure_app.testbed.peer_table), and ``fedcure testbed``'s peer options' one-line errors (no
root needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.cli import build_parser
from fedcure_app.cli.errors import UsageError
from fedcure_app.cli.testbed_peer import check_peer_options
from fedcure_app.testbed.peer_table import (
    accuracy_at,
    comparison,
    markdown,
    target_accuracy,
    time_to_target,
)


def _rec(t: float, acc: float | None) -> dict:
    return {"time_s": t, "accuracy": acc}


RUN = [_rec(0.0, 0.1), _rec(5.0, None), _rec(10.0, 0.6), _rec(20.0, 0.5), _rec(30.0, 0.9)]


def test_time_to_target_is_the_first_evaluated_model_that_reaches_it():
    assert time_to_target(RUN, 0.55) == 10.0
    assert time_to_target(RUN, 0.6) == 10.0  # reaching it exactly counts
    assert time_to_target(RUN, 0.7) == 30.0
    assert time_to_target(RUN, 0.95) is None


def test_accuracy_at_a_time_is_the_last_model_evaluated_by_then():
    assert accuracy_at(RUN, 9.9) == 0.1
    assert accuracy_at(RUN, 25.0) == 0.5  # a later dip counts: the model is the last one made
    assert accuracy_at([_rec(3.0, 0.4)], 1.0) is None


records = st.lists(st.tuples(st.floats(0, 1e4), st.one_of(st.none(), st.floats(0, 1))),
                   min_size=1, max_size=30).map(lambda xs: [_rec(t, a) for t, a in xs])


@given(records, st.floats(0, 1), st.floats(0, 1))
def test_a_higher_target_is_never_reached_sooner(run, a, b):
    lo, hi = sorted((a, b))
    t_lo, t_hi = time_to_target(run, lo), time_to_target(run, hi)
    if t_hi is not None:
        assert t_lo is not None and t_lo <= t_hi


@given(records, st.floats(0, 1))
def test_at_the_time_to_target_some_model_made_then_reaches_it(run, target):
    t = time_to_target(run, target)
    if t is None:
        assert all(r["accuracy"] is None or r["accuracy"] < target for r in run)
    else:
        assert any(r["time_s"] == t and r["accuracy"] is not None and r["accuracy"] >= target
                   for r in run)


def test_the_target_is_nine_tenths_of_the_better_final_accuracy_unless_given():
    assert target_accuracy([0.8, None, 0.5]) == pytest.approx(0.72)
    assert target_accuracy([0.8], given=0.3) == 0.3
    with pytest.raises(ValueError, match="no target"):
        target_accuracy([None])


def test_the_comparison_puts_both_methods_on_one_target_and_one_common_time():
    peer = [_rec(0.0, 0.1), _rec(40.0, 0.7), _rec(80.0, 0.8)]
    table = comparison({"fedcure": {"records": RUN, "rounds": 4, "client_steps": 400},
                        "fedavg": {"records": peer, "rounds": 2, "client_steps": 540}})
    assert table["target_accuracy"] == pytest.approx(0.81)
    assert table["common_s"] == 30.0
    fedcure, fedavg = table["rows"]
    assert (fedcure["time_to_target_s"], fedavg["time_to_target_s"]) == (30.0, None)
    assert (fedcure["accuracy_at_common_s"], fedavg["accuracy_at_common_s"]) == (0.9, 0.1)
    assert fedavg["client_steps"] == 540 and fedavg["wall_seconds"] == 80.0
    text = markdown(table)
    assert "| fedavg | never | 80.0 % | 10.0 % | 80 | 2 | 540 |" in text
    assert "| fedcure | 30 s | 90.0 % |" in text and "target: 81.0 %" in text
    for row, spans in zip(table["rows"], [(0.3, 0.25), (12.5, 0.5)]):
        row["mean_clientapp_s"], row["mean_train_s"] = spans
    assert "| 540 | 12.50 (0.50) |" in markdown(table)


@pytest.mark.parametrize("argv, word", [
    (["--against", "x"], "--against needs --peer"),
    (["--target", "0.5"], "--target needs --peer"),
    (["--peer", "fedavg", "--fraction", "0"], "--fraction"),
    (["--peer", "fedavg", "--target", "1.5"], "--target"),
    (["--peer", "fedavg", "--peer-rounds", "0"], "--peer-rounds"),
    (["--peer", "fedavg", "--against", "/nonexistent"], "no result.json"),
])
def test_peer_options_are_checked_with_one_line_naming_the_option(argv, word):
    args = build_parser().parse_args(["testbed", *argv])
    with pytest.raises(UsageError, match=word):
        check_peer_options(args)
