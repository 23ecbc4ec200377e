"""The per-client FedAvg weight cap (fedcure_app.core.weight_cap)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core.weight_cap import cap_weights, capped_counts

counts_st = st.lists(st.integers(0, 10**12), min_size=1, max_size=12).filter(
    lambda c: sum(c) > 0)
cap_st = st.floats(0.01, 1.0)


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, cap=cap_st)
def test_capped_weights_sum_to_one_stay_under_the_cap_and_keep_the_order(counts, cap):
    w = cap_weights(counts, cap)
    assert w.shape == (len(counts),)
    assert w.sum() == pytest.approx(1.0, abs=1e-9)
    assert np.all(w >= 0)
    if len(counts) * cap >= 1.0:  # feasible
        assert w.max() <= cap + 1e-12
    else:
        assert np.allclose(w, 1.0 / len(counts))
    s = np.asarray(counts, dtype=np.float64)
    for i in range(len(s)):
        for j in range(len(s)):
            if s[i] < s[j]:
                assert w[i] <= w[j] + 1e-12


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, cap=cap_st)
def test_weights_under_the_cap_are_the_plain_proportions(counts, cap):
    s = np.asarray(counts, dtype=np.float64)
    p = s / s.sum()
    if p.max() <= cap:
        assert np.allclose(cap_weights(counts, cap), p, rtol=1e-12, atol=0)


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, cap=cap_st)
def test_capped_counts_never_raise_a_count_and_give_the_capped_weights(counts, cap):
    s = np.asarray(counts, dtype=np.float64)
    c = capped_counts(counts, cap)
    assert np.all(c <= s * (1 + 1e-12))
    if np.all(s > 0):
        assert np.allclose(c / c.sum(), cap_weights(counts, cap), rtol=1e-9, atol=1e-12)


def test_one_liar_takes_at_most_the_cap_and_the_honest_keep_their_ratio():
    w = cap_weights([100, 300, 10**9], 0.5)
    assert w[2] == pytest.approx(0.5)
    assert w[1] / w[0] == pytest.approx(3.0)
    # its coalition's data share grows by at most cap/(1-cap) of the honest counts
    assert capped_counts([100, 300, 10**9], 0.5).sum() == pytest.approx(800.0)


@pytest.mark.parametrize("counts,cap", [([], 0.5), ([1, -1], 0.5), ([0, 0], 0.5),
                                        ([1, float("nan")], 0.5), ([1, 2], 0.0),
                                        ([1, 2], 1.5)])
def test_bad_counts_or_cap_are_refused(counts, cap):
    with pytest.raises(ValueError):
        cap_weights(counts, cap)


def test_capped_by_coalition_caps_each_coalition_apart_and_keeps_the_rest():
    from fedcure_app.core.weight_cap import capped_by_coalition

    counts = [100, 300, 10**9, 50, 7]
    out = capped_by_coalition(counts, [[0, 1, 2], [3]], 0.5)
    assert out.tolist() == [100, 300, 400, 50, 7]  # the liar held at the others' 400
    assert capped_by_coalition(counts, [[0, 1, 2]], 1.0).tolist() == counts
