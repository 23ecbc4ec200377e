"""CPU-bandwidth actuator: a frequency directive as a CPU quota on the training process.

A machine without cpufreq control (a VM, a shared server) can still make a client compute at the
speed its device profile has at the directed frequency f: the training process runs in a cgroup
of its own whose CPU bandwidth is

    quota = clamp(predicted(f) / host, 1 ms / period, 1) × period

- ``predicted(f) = f·10⁹ / cycles_per_sample`` samples/s: the profile's speed at f GHz;
- ``host``: samples/s the model trains at on one unthrottled core of this machine (one
  calibration, :func:`calibrate_host`);
- at most one core (the trainer uses one torch thread), at least the kernel's smallest quota,
  1 ms per period (anything slower is rounded up to it);
- the period is 20 ms, stretched for a device slower than 5 % of a host core (up to
  :data:`MAX_PERIOD_US`) so that its quota at f_min stays at least 1 ms
  (:func:`period_for`): :data:`MIN_FRACTION` of a core is the slowest a client can be made.

The frequency reported back is the one the quota really gives: the directive clamped to the
profile's range, and lowered to what one host core computes when the profile at f is faster
than the host. cgroup v2 (``cpu.max``) is used where the machine's unified hierarchy has the
``cpu`` controller, cgroup v1 (``cpu.cfs_quota_us``/``cpu.cfs_period_us``) otherwise. Frequencies
in GHz, times in microseconds where the name says ``_us``.
"""

from __future__ import annotations

import atexit
import errno
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedcure_app.devices.profiles import DeviceProfile

logger = logging.getLogger("fedcure_app.devices")

#: the CFS period the actuator writes (µs): 20 ms, short against a training step so that a
#: task's time does not depend on where in a period it starts (the kernel's default is 100 ms)
PERIOD_US = 20_000
#: smallest quota at the default period, as a fraction of one core: 5 % (1 ms of every 20 ms
#: period, the kernel's smallest quota)
FLOOR_FRACTION = 0.05
#: the longest CFS period the actuator writes (µs), for the slowest devices (:func:`period_for`)
MAX_PERIOD_US = 200_000
#: the smallest share of a core a client can be throttled to: 1 ms of the longest period
MIN_FRACTION = 1_000 / MAX_PERIOD_US
#: host cores a testbed keeps for the roles around the clients' training (messaging, the
#: edges' aggregation, the cloud): the clients' quotas should add up to at most the rest
ROLE_RESERVE_CORES = 0.5
#: the kernel refuses CFS quotas under 1 ms
KERNEL_MIN_QUOTA_US = 1_000
#: default prefix of the cgroups the actuator makes (``<prefix>-<pid>``)
DEFAULT_CGROUP_PREFIX = "fedcure"


class CgroupError(OSError):
    """No writable cgroup CPU controller, or it refused a value."""


def _check_positive(name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def predicted_samples_per_s(profile: DeviceProfile, model: str, f_ghz: float) -> float:
    """Training samples per second ``profile`` computes at ``f_ghz`` GHz: f·10⁹ / cycles."""
    return _check_positive("f_ghz", f_ghz) * 1e9 / profile.cycles_for(model)


def quota_fraction(predicted_sps: float, host_sps: float,
                   floor: float = FLOOR_FRACTION) -> float:
    """Share of one core (``floor``..1) that makes this host compute ``predicted_sps``."""
    p = _check_positive("predicted_sps", predicted_sps)
    h = _check_positive("host_sps", host_sps)
    if not 0 < floor <= 1:
        raise ValueError(f"floor must be in (0, 1], got {floor!r}")
    return min(1.0, max(floor, p / h))


def quota_floor(period_us: int) -> float:
    """The smallest share of a core a quota can give with ``period_us`` (µs): the kernel's 1 ms
    of it."""
    return min(1.0, KERNEL_MIN_QUOTA_US / period_us)


def quota_us(fraction: float, period_us: int = PERIOD_US) -> int:
    """The CFS quota (µs per ``period_us``) for ``fraction`` of one core, at least 1 ms."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    if period_us < KERNEL_MIN_QUOTA_US:
        raise ValueError(f"period_us must be >= {KERNEL_MIN_QUOTA_US}, got {period_us!r}")
    return max(KERNEL_MIN_QUOTA_US, round(fraction * period_us))


def plan_quota(profile: DeviceProfile, model: str, f_ghz: float, host_sps: float,
               period_us: int = PERIOD_US) -> tuple[int, float]:
    """(quota µs, applied GHz) for directive ``f_ghz`` on ``profile``, ``host_sps`` host speed.

    The directive is first clamped to the profile's [f_min, f_max]; the applied frequency is the
    one the quota gives back (lower than the directive when capped at one core, higher when
    raised to the floor)."""
    f = profile.clamp(_check_positive("f_ghz", f_ghz))
    q = quota_us(quota_fraction(predicted_samples_per_s(profile, model, f), host_sps,
                                quota_floor(period_us)), period_us)
    applied = (q / period_us) * host_sps * profile.cycles_for(model) / 1e9
    return q, applied


def period_for(profile: DeviceProfile, model: str, host_sps: float) -> int:
    """The CFS period (µs) for ``profile``'s cgroup: :data:`PERIOD_US`, stretched up to
    :data:`MAX_PERIOD_US` where the profile at f_min computes less than 1 ms of it, so that its
    quota is never raised to the kernel's 1 ms floor (what a period of 20 ms would do below 5 %
    of a core)."""
    share = predicted_samples_per_s(profile, model, profile.f_min_ghz) / _check_positive(
        "host_sps", host_sps)
    return int(min(MAX_PERIOD_US, max(PERIOD_US, math.ceil(KERNEL_MIN_QUOTA_US / share))))


def cores_asked(profiles: Sequence[DeviceProfile], model: str, host_sps: float) -> float:
    """Host cores the clients' quotas add up to when all of them train at f_max at once (each
    at most one core): what a testbed's first dispatch, where every coalition trains, asks."""
    return sum(quota_fraction(predicted_samples_per_s(p, model, p.f_max_ghz), host_sps,
                              quota_floor(period_for(p, model, host_sps)))
               for p in profiles)


def oversubscribed(asked: float, host_cores: float,
                   reserve: float = ROLE_RESERVE_CORES) -> bool:
    """Whether quotas adding up to ``asked`` cores leave less than ``reserve`` cores of
    ``host_cores`` to the roles (SuperLinks, SuperNodes, edges, cloud): concurrent clients then
    compute slower than their profiles say."""
    return asked > max(0.0, host_cores - reserve)


@dataclass(frozen=True)
class CpuController:
    """Where this process's CPU cgroup lives: ``version`` 1 or 2, the folder ``base`` new
    cgroups go under (this process's own cgroup in that hierarchy)."""

    version: int
    base: Path


def _mounts(mounts: str | Path = "/proc/self/mounts") -> list[tuple[str, str, list[str]]]:
    out = []
    try:
        text = Path(mounts).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[2], parts[1].replace("\\040", " "), parts[3].split(",")))
    return out


def _own_cgroup(version: int, proc_cgroup: str | Path = "/proc/self/cgroup") -> str:
    """This process's path inside the v1 ``cpu`` or the v2 hierarchy (``/`` when unknown)."""
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return "/"
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and hid == "0" and controllers == "":
            return path or "/"
        if version == 1 and "cpu" in controllers.split(","):
            return path or "/"
    return "/"


def find_cpu_controller(mounts: str | Path = "/proc/self/mounts",
                        proc_cgroup: str | Path = "/proc/self/cgroup") -> CpuController:
    """The writable CPU controller of this machine: v2 with ``cpu`` enabled, else v1 ``cpu``.

    Raises :class:`CgroupError` (one line saying why) when there is none or it is read-only."""
    found = _mounts(mounts)
    reasons = []
    for fstype, point, _opts in found:
        if fstype != "cgroup2":
            continue
        controllers = (Path(point) / "cgroup.controllers")
        try:
            if "cpu" in controllers.read_text().split():
                base = Path(point) / _own_cgroup(2, proc_cgroup).lstrip("/")
                if os.access(base, os.W_OK):
                    return CpuController(2, base)
                reasons.append(f"{base} is not writable")
            else:
                reasons.append(f"the cgroup v2 tree at {point} has no cpu controller")
        except OSError:
            continue
    for fstype, point, opts in found:
        if fstype == "cgroup" and "cpu" in opts:
            base = Path(point) / _own_cgroup(1, proc_cgroup).lstrip("/")
            if os.access(base, os.W_OK) and (base / "cpu.cfs_quota_us").exists():
                return CpuController(1, base)
            reasons.append(f"{base} is not writable (run as root)")
    if not reasons:
        reasons.append("no cgroup cpu controller is mounted")
    raise CgroupError(errno.ENOENT, "; ".join(reasons))


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as err:
        raise CgroupError(err.errno, f"writing {value!r} to {path} failed: {err.strerror}") \
            from None


class CgroupCpuBandwidth:
    """Throttles this process to its device profile's speed at the directed frequency.

    ``period_us``: the CFS period (default :func:`period_for` the profile). Makes the cgroup
    ``<base>/<name>`` and moves process ``pid`` (default this one, with all its
    threads) into it; :meth:`apply` writes the quota from :func:`plan_quota`; :meth:`close`
    (also at exit) moves the process back and removes the cgroup. The quota really slows the
    process, so :meth:`stretch` leaves measured time as is.
    """

    def __init__(self, profile: DeviceProfile, model: str, host_sps: float, *,
                 name: str | None = None, controller: CpuController | None = None,
                 pid: int | None = None, period_us: int | None = None) -> None:
        self.profile = profile
        self.model = model
        profile.cycles_for(model)  # KeyError early for a model the profile lacks
        self.host_sps = _check_positive("host_sps", host_sps)
        self.period_us = int(period_for(profile, model, self.host_sps) if period_us is None
                             else period_us)
        self.pid = os.getpid() if pid is None else int(pid)
        self.controller = controller or find_cpu_controller()
        name = name or f"{DEFAULT_CGROUP_PREFIX}-{self.pid}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name):
            raise ValueError(f"cgroup name {name!r}: letters, digits, '_', '.', '-' only")
        self.path = self.controller.base / name
        self._parent = self.controller.base
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as err:
            raise CgroupError(err.errno, f"cannot make {self.path}: {err.strerror}") from None
        if self.controller.version == 2:
            try:  # a v2 child gets the cpu controller only when its parent delegates it
                (self._parent / "cgroup.subtree_control").write_text("+cpu")
            except OSError:
                pass
            _write(self.path / "cpu.max", f"max {self.period_us}")
        else:
            _write(self.path / "cpu.cfs_period_us", str(self.period_us))
            _write(self.path / "cpu.cfs_quota_us", "-1")
        _write(self.path / "cgroup.procs", str(self.pid))
        self.quota_us: int | None = None
        self._closed = False
        atexit.register(self.close)

    def apply(self, f_ghz: float) -> float:
        """Write the quota for ``f_ghz``; return the frequency it gives (GHz)."""
        q, applied = plan_quota(self.profile, self.model, f_ghz, self.host_sps, self.period_us)
        self.set_quota_us(q)
        logger.debug("cgroup %s: directive %.3f GHz -> quota %d/%d us (%.3f GHz)",
                     self.path, f_ghz, q, self.period_us, applied)
        return applied

    def set_quota_us(self, quota: int | None) -> None:
        """Write a raw quota (µs per period; None: unlimited)."""
        if self.controller.version == 2:
            _write(self.path / "cpu.max", f"{'max' if quota is None else quota} {self.period_us}")
        else:
            _write(self.path / "cpu.cfs_quota_us", "-1" if quota is None else str(quota))
        self.quota_us = quota

    def stretch(self, measured_seconds: float, f_applied: float) -> float:
        """Measured time is real under the quota: returned unchanged (s)."""
        return float(measured_seconds)

    def close(self) -> None:
        """Move the process back to the parent cgroup and remove this one (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            (self._parent / "cgroup.procs").write_text(str(self.pid))
        except OSError:
            pass  # the process is gone
        try:
            self.path.rmdir()
        except OSError as err:
            logger.debug("cannot remove %s: %s", self.path, err.strerror)


def remove_cgroups(prefix: str, controller: CpuController | None = None) -> list[Path]:
    """Remove every cgroup named ``<prefix>*`` under the controller's base whose processes are
    gone (moving none); returns the folders removed. Raises nothing."""
    try:
        ctl = controller or find_cpu_controller()
    except CgroupError:
        return []
    removed = []
    for d in sorted(ctl.base.glob(f"{prefix}*")):
        if not d.is_dir():
            continue
        try:
            d.rmdir()
            removed.append(d)
        except OSError as err:
            logger.warning("cannot remove cgroup %s: %s", d, err.strerror)
    return removed


def calibrate_host(train_once: Callable[[int], Any], samples_per_step: int,
                   min_seconds: float = 1.0, clock: Callable[[], float] | None = None) -> float:
    """Samples/s of ``train_once(steps)`` on this process, unthrottled: one warm-up step, then
    doubling step counts until a run lasts ``min_seconds``."""
    import time

    clock = clock or time.perf_counter
    train_once(1)
    steps = 2
    while True:
        t0 = clock()
        train_once(steps)
        dt = clock() - t0
        if dt >= min_seconds or steps >= 4096:
            return steps * samples_per_step / max(dt, 1e-9)
        steps *= 2


__all__ = [
    "DEFAULT_CGROUP_PREFIX", "FLOOR_FRACTION", "KERNEL_MIN_QUOTA_US", "MAX_PERIOD_US",
    "MIN_FRACTION", "PERIOD_US", "period_for", "quota_floor",
    "ROLE_RESERVE_CORES", "CgroupCpuBandwidth", "CgroupError", "CpuController", "calibrate_host",
    "cores_asked", "find_cpu_controller", "oversubscribed", "plan_quota", "predicted_samples_per_s",
    "quota_fraction", "quota_us", "remove_cgroups",
]
