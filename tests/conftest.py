"""Suite-wide set-up: the thread policy (one torch thread per process,
``fedcure_app.runtime.threads``).

Set before any test runs, and exported as ``$FEDCURE_NUM_THREADS`` so that the processes tests
start (worker pools, Ray workers, ClientApps, CLI subprocesses) follow it too. Override it for a
run with ``FEDCURE_NUM_THREADS=N python3 -m pytest``.
"""

from __future__ import annotations

from fedcure_app.runtime.threads import apply_thread_policy

apply_thread_policy(where="tests", export=True)
