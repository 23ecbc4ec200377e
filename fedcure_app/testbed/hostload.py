"""How much of the host other processes keep busy before a testbed starts (cores).

The testbed's CPU quotas emulate each device's speed only while the host has the cores they ask
for: :mod:`fedcure_app.testbed.scaling` fits the clients' quotas at f_max into the host's cores
less the roles' reserve, and counts every core as free. Beside other CPU-bound work they do not
fit, and the latencies stop following the profiles (docs/benchmarks.md, "Testbed": beside one
CPU-bound process on a 2-core host a 9-client MNIST testbed measured 1.4–2.2× its predicted
task latencies, and the default run's slowest coalition was 1.53× its fastest instead of 2.29×).
:func:`measure_busy_cores` reads ``/proc/stat`` twice while this process sleeps, so the busy
share it sees is the other processes'; ``fedcure testbed`` warns when they leave too few cores.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

#: other processes keeping at least this many cores busy make a host "busy" (cores)
BUSY_WARN_CORES = 0.25
#: the aggregate line of ``/proc/stat`` and its fields, in jiffies (proc(5))
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_IDLE = {"idle", "iowait"}


class CpuTimes(NamedTuple):
    """Cumulative CPU time of all cores (jiffies): ``busy`` (user, nice, system, irq, softirq,
    steal; guest time is inside user) and ``total`` (busy plus idle and iowait)."""

    busy: int
    total: int


def parse_proc_stat(text: str) -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat`` text as :class:`CpuTimes`; ``ValueError``
    when there is none (fields missing on old kernels count as 0)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                values = [int(v) for v in parts[1:1 + len(_FIELDS)]]
            except ValueError:
                raise ValueError(f"/proc/stat: unreadable cpu line {line!r}") from None
            if len(values) < 4 or min(values) < 0:
                raise ValueError(f"/proc/stat: unreadable cpu line {line!r}")
            named = dict(zip(_FIELDS, values))
            busy = sum(v for k, v in named.items() if k not in _IDLE)
            return CpuTimes(busy, busy + sum(v for k, v in named.items() if k in _IDLE))
    raise ValueError("/proc/stat has no aggregate 'cpu' line")


def busy_cores(before: CpuTimes, after: CpuTimes, cores: float) -> float:
    """Cores kept busy between two readings: ``cores`` × the busy share of the elapsed CPU
    time, in [0, cores] (0 when no time elapsed)."""
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores}")
    total = after.total - before.total
    if total <= 0:
        return 0.0
    share = (after.busy - before.busy) / total
    return float(min(cores, max(0.0, cores * share)))


def _read_proc_stat() -> str:
    with open("/proc/stat") as f:
        return f.read()


def measure_busy_cores(cores: float, window_s: float = 1.0, *,
                       read: Callable[[], str] = _read_proc_stat,
                       sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Cores other processes keep busy over ``window_s`` seconds (this one sleeps meanwhile);
    None where ``/proc/stat`` cannot be read (not Linux)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0 s, got {window_s}")
    try:
        before = parse_proc_stat(read())
        sleep(window_s)
        after = parse_proc_stat(read())
    except (OSError, ValueError):
        return None
    return busy_cores(before, after, cores)


def is_busy(busy: float | None) -> bool:
    """Whether other processes keep enough of the host busy to matter (:data:`BUSY_WARN_CORES`)."""
    return busy is not None and busy >= BUSY_WARN_CORES


def warn_oversubscribed(profiles: list[Any], model: str, host_sps: float,
                        host_cores: int | None = None, busy_cores: float | None = None) -> bool:
    """Warn (and return True) when the clients' quotas at f_max leave the roles less than
    :data:`~fedcure_app.devices.cgroup.ROLE_RESERVE_CORES` of this host's cores, or, on a busy
    host (``busy_cores``: cores other processes kept busy before the start, at least
    :data:`BUSY_WARN_CORES`), of the cores those leave free."""
    from fedcure_app.devices.cgroup import ROLE_RESERVE_CORES, cores_asked, oversubscribed

    cores = host_cores or os.cpu_count() or 1
    asked = cores_asked(profiles, model, host_sps)
    if oversubscribed(asked, cores):
        log.warning("the %d clients' CPU quotas add up to %.2f cores at f_max and this host has "
                    "%d (%.1f kept for the roles): coalitions that train at once will compute "
                    "slower than their profiles; use fewer or slower devices (--mix, --profiles) "
                    "for latencies true to the profiles", len(profiles), asked, cores,
                    ROLE_RESERVE_CORES)
        return True
    left = cores - (busy_cores or 0.0)
    if is_busy(busy_cores) and oversubscribed(asked, left):
        log.warning("this host is busy: other processes kept %.2f of its %d cores busy before "
                    "the start, and the %d clients' CPU quotas (%.2f cores at f_max) with %.1f "
                    "kept for the roles do not fit the %.2f left: the coalitions' latencies will "
                    "not follow their profiles; stop the other work, or slow the devices "
                    "(--client-cores) for latencies true to the profiles", busy_cores, cores,
                    len(profiles), asked, ROLE_RESERVE_CORES, left)
        return True
    return False


__all__ = ["BUSY_WARN_CORES", "CpuTimes", "busy_cores", "is_busy", "measure_busy_cores",
           "parse_proc_stat", "warn_oversubscribed"]
