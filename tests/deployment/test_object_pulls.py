"""Short object-pull waits (issue 12): Flower's pull functions as the warm client's SuperNode,
its executor and the edge ServerApp call them retry an object that has not landed yet after
10 ms instead of 1 s, and a Flower that changed underneath is left alone."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from flwr.superlink.grid import http_grid
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError, pull_objects
from flwr.supernode import start_client_internal
from flwr.supernode.runtime import run_clientapp

from fedcure_app.flower.fastpath import gate
from fedcure_app.flower.fastpath.object_pulls import check_pull_function, quick, quick_pulls
from tests.flower_range import above

ROOT = Path(__file__).resolve().parents[2]

#: every Flower function whose waits FedCure shortens, by the module that calls it
TARGETS = [(start_client_internal, "pull_objects"), (http_grid, "pull_objects"),
           (run_clientapp, "pull_and_inflate_object_from_tree")]


def test_the_pull_functions_fit_the_pinned_flower():
    """Fails when Flower changes underneath: each function it wraps still takes the keywords it
    sets (the version is the gate's: tests/test_fastpath_gate.py)."""
    for module, name in TARGETS:
        assert check_pull_function(getattr(module, name)) == [], (module.__name__, name)


def test_short_waits_are_filled_in_unless_the_caller_sets_them():
    seen: list[dict] = []

    def pull(ids, fn, *, initial_backoff=1, backoff_cap=10, max_tries_per_object=500,
             max_time=7200):
        seen.append(dict(initial_backoff=initial_backoff, backoff_cap=backoff_cap,
                         max_tries_per_object=max_tries_per_object, max_time=max_time))
        return ids

    fast = quick(pull, 0.02, 0.3)
    assert fast(["a"], None) == ["a"]
    assert seen[-1] == dict(initial_backoff=0.02, backoff_cap=0.3, max_tries_per_object=None,
                            max_time=7200)  # Flower's total patience unless bounded
    fast(["a"], None, initial_backoff=2.0)
    assert seen[-1]["initial_backoff"] == 2.0 and seen[-1]["backoff_cap"] == 0.3
    quick(pull, 0.02, 0.3, max_time_s=60.0)(["a"], None)
    assert seen[-1]["max_time"] == 60.0
    with pytest.raises(ValueError):
        quick(pull, 0.5, 0.1)
    with pytest.raises(ValueError):
        quick(pull, 0.01, 0.1, max_time_s=0.0)


def test_an_object_that_never_lands_fails_the_pull_after_the_bound_not_the_session():
    """A client killed while uploading its reply: the edge's pull gives up after its bound and
    Flower turns that into an error reply, instead of blocking the edge round for minutes."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    def never(object_id: str) -> bytes:
        raise ObjectUnavailableError(object_id)

    with pytest.raises(ObjectPullError):
        quick(pull_objects, 0.01, 0.05, max_time_s=0.3)(["x"], never)


def test_an_object_that_lands_late_is_still_pulled_by_flowers_own_function():
    misses = {"x": 3}

    def pull_one(object_id: str) -> bytes:
        if misses[object_id]:
            misses[object_id] -= 1
            raise ObjectUnavailableError(object_id)
        return b"content"

    assert quick(pull_objects)(["x"], pull_one) == {"x": b"content"}
    assert misses == {"x": 0}


def test_quick_pulls_patches_a_module_once_and_leaves_a_changed_flower_alone():
    def pull(ids, fn, *, initial_backoff=1, backoff_cap=10, max_tries_per_object=500,
             max_time=7200):
        return ids

    module = types.ModuleType("fake_flower_module")
    module.pull_objects = pull
    assert quick_pulls(module, "pull_objects", 0.01, 0.1)
    wrapped = module.pull_objects
    assert wrapped is not pull and wrapped.__wrapped__ is pull
    assert quick_pulls(module, "pull_objects", max_time_s=5.0)  # wrapped again, not twice
    assert module.pull_objects.__wrapped__ is pull

    def changed(ids, fn, *, retry_policy=None):  # a Flower that renamed its keywords
        return ids

    module.pull_objects = changed
    assert not quick_pulls(module, "pull_objects")
    assert module.pull_objects is changed
    assert any("no longer takes" in p for p in check_pull_function(changed))
    # its own check is complete: it applies outside the supported range and with the gate
    # forced closed too, and only FEDCURE_FASTPATH_OFF=object_pulls turns it off
    assert check_pull_function(pull, version=above()) == []
    with pytest.MonkeyPatch.context() as env:
        env.setenv(gate.FORCE_ENV, "off")
        assert check_pull_function(pull) == []
        env.setenv(gate.PATCH_OFF_ENV, "object_pulls")
        assert "object_pulls is turned off" in check_pull_function(pull)[0]
