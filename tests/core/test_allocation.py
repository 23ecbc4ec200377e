"""CPU-frequency rule (Theorem 2) against a numerical maximiser of the utility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from fedcure_app.core.allocation import frequency_utility, optimal_frequency


@settings(max_examples=80, deadline=None)
@given(
    cycles=st.floats(1e6, 5e10),
    t_hat=st.floats(0.01, 100.0),
    alpha=st.floats(0.1, 10.0),
    gamma=st.floats(0.001, 2.0),
    varsigma=st.floats(0.5, 4.0),
    f_min=st.floats(0.1, 1.5),
    width=st.floats(0.0, 3.0),
)
def test_rule_equals_numerical_maximiser(cycles, t_hat, alpha, gamma, varsigma, f_min, width):
    f_max = f_min + width
    kw = dict(alpha=alpha, gamma=gamma, varsigma=varsigma)
    f_star = optimal_frequency(cycles, t_hat, f_min_ghz=f_min, f_max_ghz=f_max, **kw)
    assert isinstance(f_star, float) and f_min <= f_star <= f_max

    def u(f):
        return frequency_utility(f, cycles, t_hat, **kw)

    if width == 0.0:
        assert f_star == f_min
        return
    res = minimize_scalar(lambda f: -u(f), bounds=(f_min, f_max), method="bounded",
                          options={"xatol": 1e-10})
    best = max(-res.fun, u(f_min), u(f_max))
    assert u(f_star) >= best - 1e-9 * max(1.0, abs(best))
    # stationary point inside the box: the numerical optimum agrees in f as well
    raw = (alpha * cycles / 1e9 / (varsigma * gamma * t_hat)) ** (1 / (varsigma + 1))
    if f_min + 1e-3 < raw < f_max - 1e-3:
        assert f_star == pytest.approx(raw, rel=1e-12)
        assert res.x == pytest.approx(raw, rel=1e-4, abs=1e-6)


def test_vectorised_equals_scalar_and_clamps():
    cycles = np.array([1e8, 3e9, 5e10, 0.0])
    f_min = np.array([0.5, 0.5, 0.5, 0.3])
    f_max = np.array([2.0, 2.0, 2.0, 1.0])
    kw = dict(alpha=1.0, gamma=0.05, varsigma=2.0)
    vec = optimal_frequency(cycles, 0.5, f_min_ghz=f_min, f_max_ghz=f_max, **kw)
    assert isinstance(vec, np.ndarray) and vec.shape == (4,)
    for i in range(4):
        assert vec[i] == optimal_frequency(float(cycles[i]), 0.5, f_min_ghz=float(f_min[i]),
                                           f_max_ghz=float(f_max[i]), **kw)
    assert vec[2] == 2.0 and vec[3] == 0.3  # clamped to f_max / f_min
    # longer allowed latency -> lower frequency
    slow = optimal_frequency(3e9, 5.0, f_min_ghz=0.1, f_max_ghz=5.0, **kw)
    fast = optimal_frequency(3e9, 0.5, f_min_ghz=0.1, f_max_ghz=5.0, **kw)
    assert slow < fast


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cycles=-1.0), "cycles"),
        (dict(t_hat_s=0.0), "t_hat_s"),
        (dict(t_hat_s=np.nan), "NaN"),
        (dict(f_min_ghz=3.0), "exceed"),
        (dict(f_min_ghz=0.0), "f_min_ghz"),
        (dict(alpha=0.0), "alpha"),
        (dict(gamma=-1.0), "gamma"),
        (dict(varsigma=np.inf), "varsigma"),
        (dict(cycles=np.ones(3), f_max_ghz=np.ones(2) * 2), "broadcast"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(cycles=1e9, t_hat_s=1.0, alpha=1.0, gamma=0.05, varsigma=2.0, f_min_ghz=0.5,
                f_max_ghz=2.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        optimal_frequency(args.pop("cycles"), args.pop("t_hat_s"), **args)
    with pytest.raises(ValueError, match="f_ghz"):
        frequency_utility(0.0, 1e9, 1.0, alpha=1.0, gamma=0.05, varsigma=2.0)
