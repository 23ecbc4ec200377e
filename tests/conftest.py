"""Suite-wide set-up: the thread policy (one torch thread per process,
``fedcure_app.runtime.threads``).

Set before any test runs, and exported as ``$FEDCURE_NUM_THREADS`` so that the processes tests
start (worker pools, Ray workers, ClientApps, CLI subprocesses) follow it too. Override it for a
run with ``FEDCURE_NUM_THREADS=N python3 -m pytest``. Decoded datasets are cached in a private
``$FEDCURE_CACHE_DIR`` removed at the end of the session (unless the caller set one).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from fedcure_app.runtime.threads import apply_thread_policy

apply_thread_policy(where="tests", export=True)

# decoded datasets go to the user cache (fedcure_app.data.cache): the suite's own loads, and
# those of the processes it starts, go to a private folder that goes with the session instead
if not os.environ.get("FEDCURE_CACHE_DIR"):
    _cache = tempfile.mkdtemp(prefix="fedcure-test-cache-")
    os.environ["FEDCURE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)
