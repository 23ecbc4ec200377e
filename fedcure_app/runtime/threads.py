"""The one torch thread policy of every process that trains or evaluates.

Torch's default (one intra-op thread per core) collapses as soon as another process competes for
a core: on a 2-core machine a digits CNN step took 245–496 ms with 2 threads under load against
1.8–10 ms with 1 thread. So every FedCure process runs torch on **one thread by default** and
gets its parallelism from several processes instead (the simulation's worker pool, Ray actors,
one ClientApp per SuperNode).

The thread count is, in this order: an explicit ``--threads`` option (passed as ``n``),
``$FEDCURE_NUM_THREADS``, ``$OMP_NUM_THREADS`` (what ``fedcure launch --threads`` and Ray set for
their children), else 1. :func:`apply_thread_policy` sets it and logs it once per process; an
explicit value is also exported as ``$FEDCURE_NUM_THREADS`` so that child processes (worker
pools, Ray workers, Flower's ClientApp processes) follow the same policy.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)

#: Environment variable that overrides the default thread count.
ENV_VAR = "FEDCURE_NUM_THREADS"
#: Threads per process when nothing says otherwise.
DEFAULT_THREADS = 1

_applied: int | None = None
_logged = False


def policy_threads(n: int | None = None) -> tuple[int, str]:
    """The thread count the policy gives and where it comes from (``n`` wins over the
    environment). Raises ``ValueError`` with a one-line message on a bad value."""
    if n is not None:
        source = "--threads"
    else:
        for var in (ENV_VAR, "OMP_NUM_THREADS"):
            value = os.environ.get(var, "").strip()
            if value:
                try:
                    n = int(value)
                except ValueError:
                    raise ValueError(f"${var} must be an integer, got {value!r}") from None
                source = f"${var}"
                break
        else:
            n, source = DEFAULT_THREADS, "default"
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    return int(n), source


def apply_thread_policy(n: int | None = None, *, where: str = "", export: bool = False) -> int:
    """Set torch's intra-op threads for this process by the policy; return the count.

    ``n``: an explicit count (a ``--threads`` option); ``where``: the entry point, for the log
    line; ``export``: also put the count in ``$FEDCURE_NUM_THREADS`` for child processes (done
    whenever ``n`` is given). Logs the policy once per process, at INFO.
    """
    global _applied, _logged
    count, source = policy_threads(n)
    if n is not None or export:
        os.environ[ENV_VAR] = str(count)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    _applied = count
    if not _logged:
        _logged = True
        log.info("thread policy%s: %d torch thread%s per process (%s); parallel work runs in "
                 "separate processes", f" ({where})" if where else "", count,
                 "" if count == 1 else "s", source)
    return count


def applied_threads() -> int | None:
    """The count :func:`apply_thread_policy` last set in this process (None: not yet)."""
    return _applied


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


__all__ = ["DEFAULT_THREADS", "ENV_VAR", "applied_threads", "apply_thread_policy",
           "available_cores", "policy_threads"]
