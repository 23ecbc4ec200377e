"""Suite-wide set-up: the thread policy (one torch thread per process,
``fedcure_app.runtime.threads``).

Set before any test runs, and exported as ``$FEDCURE_NUM_THREADS`` so that the processes tests
start (worker pools, Ray workers, ClientApps, CLI subprocesses) follow it too. Override it for a
run with ``FEDCURE_NUM_THREADS=N python3 -m pytest``. Decoded datasets are cached in a private
``$FEDCURE_CACHE_DIR`` removed at the end of the session (unless the caller set one). Ctrl-C
(SIGINT) stops the session even when it lands in code that takes SIGINT for itself
(``tests/interrupts.py``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from fedcure_app.runtime.threads import apply_thread_policy
from tests import interrupts

apply_thread_policy(where="tests", export=True)

# decoded datasets go to the user cache (fedcure_app.data.cache): the suite's own loads, and
# those of the processes it starts, go to a private folder that goes with the session instead
if not os.environ.get("FEDCURE_CACHE_DIR"):
    _cache = tempfile.mkdtemp(prefix="fedcure-test-cache-")
    os.environ["FEDCURE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)

interrupts.track_sigint()


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """A role's ``main`` run in-process leaves its SIGINT/SIGTERM handlers: put them back."""
    before = interrupts.handlers()
    yield
    interrupts.restore_handlers(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    interrupts.stop_if_interrupted(item.session)
