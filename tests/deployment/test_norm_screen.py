"""The cloud's norm screen (:mod:`cloud_server.screening`): a step bound from the first update,
a median limit one accepted update moves by at most ``growth``, a history refused models never
enter; and the same through :class:`cloud_server.controller.CloudController`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_server.refusal import Reason, Refusal
from cloud_server.screening import FLOOR_SHARE, NormScreen, distance, lower_median, step_bound
from fedcure_app.config import FedCureConfig, apply_flat
from tests.deployment.test_controller import formed

F32_MAX = float(np.finfo(np.float32).max)


def test_the_step_bound_is_lr_tau_c_tau_e_times_the_gradient_bound():
    cfg = apply_flat(FedCureConfig(), {"lr": 0.05, "tau-c": 3, "tau-e": 4,
                                       "norm-grad-bound": 2.5})
    assert step_bound(cfg) == pytest.approx(0.05 * 3 * 4 * 2.5)
    assert NormScreen.from_config(cfg).cap == pytest.approx(1.5)
    # the defaults: lr 0.01, τ_c 5, τ_e 12, G 100
    assert step_bound(FedCureConfig()) == pytest.approx(60.0)


def test_a_fresh_screen_refuses_what_no_task_can_produce_and_accepts_a_real_step():
    s = NormScreen(cap=6.0)
    assert s.limit() == 6.0
    model = [np.zeros((64, 32), np.float32), np.zeros(32, np.float32)]
    plus_1e6 = distance([a + np.float32(1e6) for a in model], model)
    at_f32_max = distance([np.full_like(a, F32_MAX) for a in model], model)
    assert math.isfinite(at_f32_max)  # float64 holds it: refused by the bound, not by NaN
    for d in (plus_1e6, at_f32_max, 6.0001, math.inf, math.nan):
        assert s.check(d) is not None, d
    assert "step bound" in s.check(plus_1e6)
    assert s.history == type(s.history)()
    assert s.check(0.53) is None  # the first update of a digits run (docs/security.md)
    s.accept(0.53)
    assert list(s.history) == [0.53]


def test_extreme_updates_after_normal_ones_are_all_refused_and_change_nothing():
    s = NormScreen(cap=6.0)
    for d in (0.5, 0.45, 0.4, 0.42, 0.38):
        s.accept(d)
    before = s.state_dict()
    lim = s.limit()
    assert lim == pytest.approx(10 * 0.42)
    for d in [1e6, F32_MAX, 1e30, 5.0, 4.3] * 2:  # ten in a row, beyond the limit
        assert s.check(d) is not None
        with pytest.raises(ValueError):
            s.accept(d)
    assert s.state_dict() == before and s.limit() == lim
    assert s.check(0.41) is None


def test_an_accepted_outlier_enters_clipped_so_the_median_moves_by_growth_at_most():
    s = NormScreen(cap=100.0, factor=10.0, growth=2.0)
    for d in (1.0, 1.0, 1.0):
        s.accept(d)
    s.accept(9.9)  # under the limit (10), but far above the others: enters as 2
    assert list(s.history) == [1.0, 1.0, 1.0, 2.0]
    assert s.limit() == pytest.approx(10.0)


def test_the_worst_accepted_attacker_raises_the_limit_by_growth_per_update_and_never_past_cap():
    s = NormScreen(cap=50.0, factor=10.0, window=20, growth=2.0)
    for _ in range(20):
        s.accept(0.5)
    limits = [s.limit()]
    for _ in range(30):  # every update exactly at the limit
        s.accept(s.limit())
        limits.append(s.limit())
    assert all(b <= 2.0 * a + 1e-12 for a, b in zip(limits, limits[1:]))
    assert max(limits) <= 50.0
    # half the window of attackers moves nothing: the lower median is still a normal one
    assert limits[:11] == [pytest.approx(5.0)] * 11


def test_updates_that_return_the_global_model_cannot_lower_the_limit_below_the_floor():
    s = NormScreen(cap=6.0)
    for _ in range(25):
        s.accept(0.0)
    assert s.limit() == pytest.approx(FLOOR_SHARE * 6.0)
    assert s.check(0.05) is None


def test_an_older_checkpoints_poisoned_history_is_brought_under_the_bound():
    s = NormScreen(cap=6.0)
    s.load_state_dict({"factor": 10.0, "window": 20, "min_history": 3,
                       "history": [3e38, 1e30, 0.5, float("nan")]})
    assert list(s.history) == [6.0, 6.0, 0.5]
    assert s.limit() == pytest.approx(6.0)
    assert s.check(1e6) is not None
    s2 = NormScreen(cap=6.0)
    s2.load_state_dict(s.state_dict())  # the round trip changes nothing
    assert list(s2.history) == list(s.history)


def test_lower_median_is_an_element_with_half_at_or_below_it():
    assert lower_median([3.0]) == 3.0
    assert lower_median([1.0, 100.0]) == 1.0
    assert lower_median([5.0, 1.0, 3.0]) == 3.0


@settings(max_examples=300, deadline=None)
@given(cap=st.floats(1e-3, 1e3),
       factor=st.floats(1.5, 50.0),
       window=st.integers(1, 12),
       min_history=st.integers(1, 6),
       growth=st.floats(1.0, 4.0),
       seq=st.lists(st.one_of(st.floats(0.0, 2.0), st.floats(0.0, 1e40),
                              st.sampled_from([math.inf, math.nan, F32_MAX])),
                    max_size=60))
def test_refused_updates_never_change_state_and_accepted_ones_raise_the_limit_by_growth_at_most(
        cap, factor, window, min_history, growth, seq):
    s = NormScreen(cap, factor, window, min_history, growth)
    for x in seq:
        x = x * cap  # distances on the bound's scale
        before, lim = s.state_dict(), s.limit()
        assert FLOOR_SHARE * cap - 1e-12 <= lim <= cap
        if s.check(x) is None:
            assert x <= lim
            s.accept(x)
            assert s.limit() <= growth * lim * (1 + 1e-12)
            assert len(s.history) <= window and max(s.history) <= cap
        else:
            with pytest.raises(ValueError):
                s.accept(x)
            assert s.state_dict() == before


# ------------------------------------------------------------------ through the controller
def submit(c, task, arrays):
    c.formed.check_submit(task, 10, 1.0, [], [])
    return c.formed.arrive(task, arrays, 1.5, 1.2, 10, [], [], False)


def test_a_fresh_cloud_refuses_a_first_update_of_1e6_or_float32_max(tmp_path):
    # the test federation's task: lr 0.01, τ_c 1, τ_e 2; G 10 → step bound 0.2
    c, tasks = formed(tmp_path, **{"norm-grad-bound": 10.0})
    assert c.screen.cap == pytest.approx(0.2)
    glob = [a.copy() for a in c.strategy.global_arrays]
    for bad in ([a + np.float32(1e6) for a in glob], [np.full_like(a, F32_MAX) for a in glob]):
        with pytest.raises(Refusal) as err:
            submit(c, tasks[0], bad)
        assert err.value.reason is Reason.INVALID_ARGUMENT
        assert "step bound" in str(err.value) and "\n" not in str(err.value)
        assert c.strategy.version == 0 and not c.records and not c.screen.history
        assert all(np.array_equal(a, b) for a, b in zip(c.strategy.global_arrays, glob))
    assert submit(c, tasks[0], [a + np.float32(0.01) for a in glob]).record["version"] == 1


def test_ten_extreme_updates_after_normal_ones_are_refused_and_a_normal_one_then_passes(tmp_path):
    c, tasks = formed(tmp_path, **{"norm-grad-bound": 10.0, "global-rounds": 100})
    pending = list(tasks)
    for i in range(4):  # normal updates: 0.01–0.013 per weight, distance ≈ 0.03–0.04
        t = pending.pop(0)
        arrival = submit(c, t, [a + np.float32(0.01 + 0.001 * i)
                                for a in c.strategy.global_arrays])
        pending.extend(arrival.new)
    version, state = c.strategy.version, c.screen.state_dict()
    t = pending.pop(0)
    for k in range(10):
        scale = [np.float32(1e6), F32_MAX, np.float32(1e30), np.float32(0.1)][k % 4]
        bad = [np.full_like(a, scale) if scale == F32_MAX else a + scale
               for a in c.strategy.global_arrays]
        with pytest.raises(Refusal):
            submit(c, t, bad)
    assert c.strategy.version == version and c.screen.state_dict() == state
    assert submit(c, t, [a + np.float32(0.012) for a in c.strategy.global_arrays]
                  ).record["version"] == version + 1


def test_a_stale_honest_answer_is_measured_from_the_model_its_task_started_from(tmp_path):
    # coalition A's task stays out while B's answers move the global model one way, until the
    # global model is farther from A's base than the step bound: A's honest step (0.01 per
    # weight from its base) passes, while the same step from the current global model's
    # distance would not, and the same distance from A's base beyond the bound is refused
    c, tasks = formed(tmp_path, **{"norm-grad-bound": 10.0, "global-rounds": 500,
                                   "max-concurrent": 2})
    by_coalition = {t.dispatch.coalition: t for t in tasks}
    assert len(by_coalition) == 2
    a, b = by_coalition[0], by_coalition[1]
    base = [x.copy() for x in c.strategy.global_arrays]
    while distance(c.strategy.global_arrays, base) <= 2 * c.screen.cap:
        arrival = submit(c, b, [x + np.float32(0.01) for x in c.strategy.global_arrays])
        b = next(t for t in arrival.new if t.dispatch.coalition == 1)
    honest = [x + np.float32(0.01) for x in base]
    assert distance(honest, c.strategy.global_arrays) > c.screen.cap
    version = c.strategy.version
    arrival = submit(c, a, honest)
    assert arrival.record["version"] == version + 1 and arrival.record["staleness"] > 0
    a = next(t for t in arrival.new if t.dispatch.coalition == 0)
    start = [x.copy() for x in c.strategy.global_arrays]
    for t in arrival.new:  # the next task of A starts from the current model
        assert t.dispatch.version == c.strategy.version
    with pytest.raises(Refusal) as err:
        submit(c, a, [x + np.float32(1.0) for x in start])
    assert err.value.reason is Reason.INVALID_ARGUMENT and "step bound" in str(err.value)
