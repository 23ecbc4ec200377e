"""Per-class results by class name: the pure helpers behind ``class_accuracy_by_name``, the
end-of-run tables, the live view and the clients' label-count logs."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.config import FedCureConfig
from fedcure_app.live.model import LiveState, RoundPoint, StrategyView
from fedcure_app.trained.names import (
    by_name, class_rows, counts_text, extremes, holding_text, last_class_accuracy, run_classes)

accuracies = st.dictionaries(st.text(min_size=1, max_size=6),
                             st.one_of(st.none(), st.floats(0.0, 1.0)), max_size=12)


@settings(deadline=None)  # a loaded host may take a while for one example
@given(accuracies, st.integers(1, 5))
def test_weakest_and_strongest_are_disjoint_ranked_and_cover_what_they_can(acc, k):
    weak, strong = extremes(acc, k)
    known = {n: v for n, v in acc.items() if v is not None}
    assert not {n for n, _ in weak} & {n for n, _ in strong}
    assert [v for _, v in weak] == sorted(v for _, v in weak)
    assert [v for _, v in strong] == sorted((v for _, v in strong), reverse=True)
    if len(known) >= 2:
        assert len(weak) == len(strong) == min(k, len(known) // 2)
        assert weak[0][1] == min(known.values()) and strong[0][1] == max(known.values())
    else:
        assert weak == list(known.items()) and strong == []


def test_a_class_without_samples_is_none_by_name_and_left_out_of_the_extremes():
    got = by_name([0.5, math.nan, 1.0], ["bag", "coat", "shoe"])
    assert got == {"bag": 0.5, "coat": None, "shoe": 1.0}
    assert by_name([0.5], ["bag", "coat"]) is None
    rows = class_rows({"class_accuracy_by_name": got})
    assert rows == [("weakest classes", "bag 50.0 %"), ("strongest classes", "shoe 100.0 %")]
    assert class_rows({"class_accuracy_by_name": None}) == []


def test_the_last_evaluated_record_gives_the_per_class_accuracy():
    records = [{"class_accuracy": [0.1, 0.2]}, {"class_accuracy": None}]
    assert last_class_accuracy(records) == [0.1, 0.2]
    assert last_class_accuracy([{"accuracy": None}]) is None


def test_label_counts_are_named_and_empty_classes_left_out():
    assert counts_text([90, 0, 45], ["bag", "coat", "shoe"]) == "{bag: 90, shoe: 45}"
    assert counts_text([0, 0], ["bag", "coat"]) == "{bag: 0, coat: 0}"
    assert counts_text([1, 2], None) == "[1, 2]"


def test_a_client_holding_its_own_data_says_task_not_a_dataset():
    from fedcure_app.data.own_federation import with_task
    from fedcure_app.data.task import TaskConfig

    task = TaskConfig(kind="image", classes=["bag", "coat"], input_shape=[1, 4, 4])
    own = with_task(FedCureConfig(), task)
    assert holding_text(own, 270) == "task, 270 samples"
    assert run_classes(own) == ("bag", "coat")
    assert holding_text(FedCureConfig(), 12) == "digits, 12 samples"
    assert run_classes(FedCureConfig()) == tuple(str(d) for d in range(10))


def test_the_live_view_shows_the_last_evaluations_accuracy_per_class_by_name():
    row = {"round": 1, "time_s": 1.0, "coalition": 0, "version": 1, "staleness": 0, "xi": 0.2,
           "latency_s": 1.0, "estimate_s": 1.0, "queues": [0.0], "accuracy": 0.5,
           "class_accuracy": [1.0, float("nan")]}
    later = dict(row, round=2, accuracy=None, class_accuracy=None)
    view = StrategyView(history=(RoundPoint.of(row), RoundPoint.of(later)))
    state = LiveState(view=view, classes=("bag", "coat"))
    assert state.to_json()["class_accuracy"] == {"bag": 1.0, "coat": None}
    assert LiveState(classes=("bag", "coat")).to_json()["class_accuracy"] is None


def test_the_end_of_run_tables_of_simulate_and_launch_name_the_weakest_and_strongest():
    from rich.console import Console

    from fedcure_app.cli.launch_report import summary_table
    from fedcure_app.cli.simulate import _summary_table

    result = {"dataset": "task", "rounds": 3, "final_accuracy": 0.6, "best_accuracy": 0.6,
              "initial_jsd": 0.1, "formed_jsd": 0.05, "simulated_seconds": 1.0,
              "latency_cov": 0.1, "energy_j": 1.0, "participation": {"share": [1.0]},
              "wall_seconds": 1.0,
              "class_accuracy_by_name": {"bag": 0.25, "coat": 0.5, "shoe": 1.0, "shirt": 0.75}}
    for table in (_summary_table(result), summary_table(result, "testbed")):
        console = Console(width=200, record=True)
        console.print(table)
        text = console.export_text()
        assert "weakest classes" in text and "bag 25.0 %, coat 50.0 %" in text
        assert "strongest classes" in text and "shoe 100.0 %, shirt 75.0 %" in text
