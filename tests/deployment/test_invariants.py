"""The history invariants the soak and the partition tests check (tests/deployment/invariants.py)
catch what they name."""

from __future__ import annotations

import numpy as np

from tests.deployment.invariants import lost_updates, replay, same_model, version_problems


def _rec(version: int, task: str, staleness: int = 0, xi: float = 0.5, rnd: int | None = None):
    return {"version": version, "task_id": task, "staleness": staleness, "xi": xi,
            "round": version if rnd is None else rnd}


def test_a_gap_in_the_versions_and_a_task_aggregated_twice_are_both_reported():
    assert version_problems([_rec(1, "a"), _rec(2, "b")]) == []
    gap = version_problems([_rec(1, "a"), _rec(3, "b")])
    assert len(gap) == 1 and "1..2" in gap[0]
    twice = version_problems([_rec(1, "a"), _rec(2, "a")])
    assert len(twice) == 1 and "['a']" in twice[0]


def test_an_update_told_accepted_is_lost_when_its_record_is_missing_or_elsewhere():
    records = [_rec(1, "a"), _rec(2, "b", rnd=5)]
    assert lost_updates(records, [("a", 1), ("b", 2)]) == []
    assert lost_updates(records, [("b", 5)], key="round") == []
    assert lost_updates(records, [("c", 3), ("a", 2)]) == [("c", 3), ("a", 2)]


def test_replay_applies_each_update_to_the_model_of_its_base_version():
    initial = [np.zeros(2)]

    def edge(base, task):  # an edge's model: its base plus a task-specific step
        return [base[0] + (1.0 if task == "a" else 10.0)]

    # "b" trained from version 0 and arrived after "a" (staleness 1)
    got = replay(initial, [_rec(1, "a", xi=0.5), _rec(2, "b", staleness=1, xi=0.25)], edge)
    v1 = 0.5 * np.zeros(2) + 0.5 * np.ones(2)
    want = 0.75 * v1 + 0.25 * np.full(2, 10.0)
    assert same_model(got, [want])
    assert not same_model(got, [want + 1e-12])
    assert not same_model(got, [want, want])
