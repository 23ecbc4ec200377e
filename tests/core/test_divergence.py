"""Jensen–Shannon divergence and the average pairwise JSD (Eq. 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon

from fedcure_app.core.divergence import (
    average_pairwise_jsd,
    coalition_label_counts,
    js_divergence,
    jsd_matrix,
    normalise_rows,
)

LN2 = math.log(2)

counts_vec = st.lists(st.integers(0, 50), min_size=2, max_size=8).filter(lambda v: sum(v) > 0)


@st.composite
def count_pair(draw):
    c = draw(st.integers(2, 8))
    vec = st.lists(st.integers(0, 50), min_size=c, max_size=c).filter(lambda v: sum(v) > 0)
    return np.array(draw(vec), float), np.array(draw(vec), float)


@settings(max_examples=60, deadline=None)
@given(count_pair())
def test_symmetric_bounded_and_matches_scipy(pq):
    p, q = pq
    d = js_divergence(p, q)
    assert d == pytest.approx(js_divergence(q, p), abs=1e-15)
    assert 0.0 <= d <= LN2
    # scipy's jensenshannon is the square root of JSD (natural log by default)
    assert d == pytest.approx(jensenshannon(p, q) ** 2, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(count_pair())
def test_zero_iff_equal_distributions(pq):
    p, q = pq
    same = np.allclose(p / p.sum(), q / q.sum(), rtol=0, atol=0)
    d = js_divergence(p, q)
    if same:
        assert d == 0.0
    else:
        assert d > 0.0
    assert js_divergence(p, 3 * p) == 0.0


def test_disjoint_supports_give_ln2_and_counts_equal_probabilities():
    assert js_divergence([5, 0, 0], [0, 2, 7]) == pytest.approx(LN2, abs=1e-15)
    assert js_divergence([1, 3], [2, 2]) == pytest.approx(js_divergence([0.25, 0.75], [0.5, 0.5]))


@pytest.mark.parametrize(
    "p, q, match",
    [
        ([0, 0], [1, 1], "all zeros"),
        ([1, -1], [1, 1], "non-negative"),
        ([1, np.nan], [1, 1], "NaN or Inf"),
        ([1, np.inf], [1, 1], "NaN or Inf"),
        ([1, 2, 3], [1, 2], "same length"),
        ([[1, 2]], [1, 2], "1-D"),
        ([], [], "empty"),
    ],
)
def test_js_divergence_rejects_bad_input(p, q, match):
    with pytest.raises(ValueError, match=match):
        js_divergence(p, q)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(2, 6), st.integers(0, 10_000))
def test_average_pairwise_jsd_is_mean_over_pairs(m, c, seed):
    rng = np.random.default_rng(seed)
    S = rng.integers(0, 20, size=(m, c)).astype(float)
    S[:, 0] += 1  # no empty coalition
    pairs = [js_divergence(S[i], S[j]) for i in range(m) for j in range(i + 1, m)]
    expected = float(np.mean(pairs)) if pairs else 0.0
    assert average_pairwise_jsd(S) == pytest.approx(expected, abs=1e-12)
    J = jsd_matrix(normalise_rows(S))
    assert np.allclose(J, J.T) and np.all(np.diag(J) == 0)


def test_average_pairwise_jsd_edge_cases():
    assert average_pairwise_jsd([[3, 4, 5]]) == 0.0
    eye = np.eye(4) * 7
    assert average_pairwise_jsd(eye) == pytest.approx(LN2)
    with pytest.raises(ValueError, match="row 1 is all zeros"):
        average_pairwise_jsd([[1, 2], [0, 0]])
    with pytest.raises(ValueError, match="2-D"):
        average_pairwise_jsd([1, 2, 3])


def test_coalition_label_counts_sums_clients():
    counts = np.array([[1, 0], [2, 3], [0, 5], [4, 4]])
    out = coalition_label_counts(counts, [1, 0, 1, 2], 3)
    assert out.tolist() == [[2, 3], [1, 5], [4, 4]]
    assert coalition_label_counts(counts, [0, 0, 0, 0], 2).tolist() == [[7, 12], [0, 0]]


@pytest.mark.parametrize(
    "assignment, m, match",
    [
        ([0, 1, 2], 2, "outside"),
        ([0, -1, 1], 2, "outside"),
        ([0, 1], 2, "shape"),
        ([0.5, 1, 0], 2, "integer"),
    ],
)
def test_coalition_label_counts_rejects_bad_assignment(assignment, m, match):
    with pytest.raises(ValueError, match=match):
        coalition_label_counts(np.ones((3, 2)), assignment, m)


def test_coalition_label_counts_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_edges"):
        coalition_label_counts(np.ones((3, 2)), [0, 0, 0], 0)
    with pytest.raises(ValueError, match="non-negative"):
        coalition_label_counts(-np.ones((3, 2)), [0, 0, 0], 1)
