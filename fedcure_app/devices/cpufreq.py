"""CPU-frequency actuators: turning the cloud's frequency directive into what a device runs at.

- :class:`SysfsCpufreq` caps every CPU's ``scaling_max_freq`` through Linux cpufreq sysfs;
- :class:`EmulatedThrottle` stretches measured compute time by f_max/f where that is not possible;
- :class:`NoThrottle` ignores the directive;
- :func:`make_actuator` picks one (``sysfs`` falls back to emulation with a warning);
- :func:`probe_device` reports what a machine offers (cores, cpufreq, memory, board model).

Frequencies are in GHz (sysfs holds kHz).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from fedcure_app.devices.profiles import DeviceProfile

#: The package's logger name, as users see it (README quotes its cpufreq fallback warning).
logger = logging.getLogger("fedcure_app.devices")

DEFAULT_CPU_ROOT = "/sys/devices/system/cpu"


def nearest(available: Sequence[int], want: float) -> int:
    """The value of ``available`` (kHz or Hz) nearest ``want``; the lower of two equally near."""
    return min(available, key=lambda v: (abs(v - want), v))


class CpufreqError(OSError):
    """cpufreq sysfs is missing or refused a value."""


class CpufreqPermissionError(PermissionError):
    """cpufreq sysfs exists but this process may not write it."""


class FrequencyActuator(Protocol):
    """Turns a CPU-frequency directive into what the device actually runs at."""

    def apply(self, f_ghz: float) -> float:
        """Apply the directive; return the frequency actually applied (GHz)."""
        ...

    def stretch(self, measured_seconds: float, f_applied: float) -> float:
        """The compute time (s) to report for ``measured_seconds`` of work run at ``f_applied``."""
        ...


def _check_frequency(f_ghz: float) -> float:
    f = float(f_ghz)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"frequency must be a finite number > 0 GHz, got {f_ghz!r}")
    return f


def _write_sysfs(path: Path, value: str) -> None:
    """Write one sysfs attribute, translating the errors into :class:`CpufreqPermissionError`
    (not allowed) or :class:`CpufreqError` (refused)."""
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except PermissionError as err:
        raise CpufreqPermissionError(
            f"cannot write {path}: {err.strerror}; run as root, grant write access to "
            "cpufreq (e.g. a udev rule), or use the emulated throttle"
        ) from None
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise CpufreqPermissionError(
                f"cannot write {path}: {err.strerror}; run as root, grant write access to "
                "cpufreq, or use the emulated throttle"
            ) from None
        raise CpufreqError(
            err.errno, f"writing {value!r} to {path} failed: {err.strerror}"
        ) from None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_str(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_dirs(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for d in root.iterdir():
            m = re.fullmatch(r"cpu(\d+)", d.name)
            if m and (d / "cpufreq").is_dir():
                out.append((int(m.group(1)), d / "cpufreq"))
    return sorted(out)


class SysfsCpufreq:
    """Caps the CPU frequency through Linux cpufreq sysfs (Raspberry Pi, Jetson, most laptops).

    For each CPU, reads ``scaling_available_frequencies`` (kHz) and picks the available frequency
    nearest the directive; where that list is absent (e.g. intel_pstate, cppc) the directive is
    clamped to [``cpuinfo_min_freq``, ``cpuinfo_max_freq``]. It writes ``scaling_max_freq`` of
    every CPU. The hardware really runs slower, so :meth:`stretch` leaves measured time as is.
    """

    def __init__(
        self, root: str | Path = DEFAULT_CPU_ROOT, cpus: Sequence[int] | None = None
    ) -> None:
        self.root = Path(root)
        found = dict(_cpu_dirs(self.root))
        if cpus is None:
            cpus = sorted(found)
        missing = [c for c in cpus if c not in found]
        if missing:
            raise CpufreqError(
                errno.ENOENT, f"no cpufreq directory for cpu(s) {missing} under {self.root}"
            )
        if not cpus:
            raise CpufreqError(errno.ENOENT, f"no cpufreq support under {self.root}")
        self.cpus: tuple[int, ...] = tuple(int(c) for c in cpus)
        self._dirs = {c: found[c] for c in self.cpus}
        self._available_khz: dict[int, tuple[int, ...] | None] = {}
        self._range_khz: dict[int, tuple[int, int]] = {}
        for c, d in self._dirs.items():
            avail = _read_str(d / "scaling_available_frequencies")
            freqs = None
            if avail:
                try:
                    freqs = tuple(sorted({int(v) for v in avail.split()}))
                except ValueError:
                    raise CpufreqError(
                        errno.EINVAL, f"cannot parse {d / 'scaling_available_frequencies'}"
                    ) from None
            lo = _read_int(d / "cpuinfo_min_freq")
            hi = _read_int(d / "cpuinfo_max_freq")
            if freqs:
                lo, hi = freqs[0], freqs[-1]
            elif lo is None or hi is None:
                raise CpufreqError(
                    errno.ENOENT,
                    f"{d}: neither scaling_available_frequencies nor cpuinfo_min/max_freq readable",
                )
            self._available_khz[c] = freqs or None
            self._range_khz[c] = (lo, hi)
        #: cpu -> the value last written to scaling_max_freq (kHz)
        self.written_khz: dict[int, int] = {}

    @property
    def f_min_ghz(self) -> float:
        """Lowest frequency any managed CPU offers (GHz)."""
        return min(lo for lo, _ in self._range_khz.values()) / 1e6

    @property
    def f_max_ghz(self) -> float:
        """Highest frequency any managed CPU offers (GHz)."""
        return max(hi for _, hi in self._range_khz.values()) / 1e6

    def available_ghz(self, cpu: int) -> list[float] | None:
        """The discrete frequencies of ``cpu`` (GHz), or None when it takes any value in range."""
        freqs = self._available_khz[cpu]
        return None if freqs is None else [f / 1e6 for f in freqs]

    def target_khz(self, cpu: int, f_ghz: float) -> int:
        """The value (kHz) that :meth:`apply` writes for ``cpu`` given ``f_ghz``."""
        want = _check_frequency(f_ghz) * 1e6
        freqs = self._available_khz[cpu]
        if freqs is None:
            lo, hi = self._range_khz[cpu]
            return int(min(hi, max(lo, round(want))))
        return nearest(freqs, want)

    def apply(self, f_ghz: float) -> float:
        """Write the nearest available frequency to every CPU's ``scaling_max_freq``.

        Returns the lowest value written (GHz): the slowest core sets the pace. Raises
        :class:`CpufreqPermissionError` when not allowed to write.
        """
        for c in self.cpus:
            khz = self.target_khz(c, f_ghz)
            _write_sysfs(self._dirs[c] / "scaling_max_freq", str(khz))
            self.written_khz[c] = khz
        applied = min(self.written_khz[c] for c in self.cpus) / 1e6
        logger.debug("cpufreq: requested %.3f GHz, applied %.3f GHz", f_ghz, applied)
        return applied

    def stretch(self, measured_seconds: float, f_applied: float) -> float:
        """Measured time is real at the applied frequency: returned unchanged (s)."""
        return float(measured_seconds)

    def check_writable(self) -> None:
        """Write each CPU's current ``scaling_max_freq`` back unchanged; raises when not allowed."""
        for c in self.cpus:
            path = self._dirs[c] / "scaling_max_freq"
            current = _read_int(path)
            if current is None:
                current = self._range_khz[c][1]
            _write_sysfs(path, str(current))


class EmulatedThrottle:
    """Pretends to run at ``f`` on a machine running at ``f_max_ghz``: stretches compute time.

    :meth:`apply` clamps the directive to [f_min_ghz, f_max_ghz]; :meth:`stretch` turns measured
    seconds into what ``f`` would take, t·f_max/f.
    """

    def __init__(self, f_max_ghz: float, f_min_ghz: float | None = None) -> None:
        self.f_max_ghz = _check_frequency(f_max_ghz)
        self.f_min_ghz = 0.0 if f_min_ghz is None else _check_frequency(f_min_ghz)
        if self.f_min_ghz > self.f_max_ghz:
            raise ValueError(f"f_min_ghz ({f_min_ghz}) exceeds f_max_ghz ({f_max_ghz})")

    def apply(self, f_ghz: float) -> float:
        """The directive clamped to the emulated range (GHz)."""
        return min(self.f_max_ghz, max(self.f_min_ghz, _check_frequency(f_ghz)))

    def stretch(self, measured_seconds: float, f_applied: float) -> float:
        """Seconds the work would take at ``f_applied`` GHz: t·f_max/f."""
        return float(measured_seconds) * self.f_max_ghz / _check_frequency(f_applied)


class NoThrottle:
    """No frequency control: the device runs flat out at ``f_max_ghz`` and time is as measured."""

    def __init__(self, f_max_ghz: float) -> None:
        self.f_max_ghz = _check_frequency(f_max_ghz)

    def apply(self, f_ghz: float) -> float:
        """Ignores the directive; returns f_max (GHz), what the device really runs at."""
        _check_frequency(f_ghz)
        return self.f_max_ghz

    def stretch(self, measured_seconds: float, f_applied: float) -> float:
        """Returns ``measured_seconds`` unchanged."""
        return float(measured_seconds)


ActuatorKind = Literal["sysfs", "emulate", "off", "cgroup"]

#: every ``--cpufreq`` choice
ACTUATOR_KINDS: tuple[str, ...] = ("emulate", "sysfs", "cgroup", "off")


def make_actuator(
    kind: str, profile: DeviceProfile, *, root: str | Path = DEFAULT_CPU_ROOT,
    model: str | None = None, host_sps: float | None = None,
    calibrate: Callable[[], float] | None = None, cgroup_name: str | None = None,
) -> FrequencyActuator:
    """The actuator for ``kind`` (``sysfs``, ``emulate``, ``cgroup`` or ``off``) on ``profile``.

    ``sysfs`` falls back to :class:`EmulatedThrottle` with a logged warning when cpufreq is
    absent or not writable; so does ``cgroup`` when no cgroup CPU controller is writable.
    ``cgroup`` needs ``model`` (the dataset whose cycles per sample count) and the host's
    samples/s on one core: ``host_sps``, or ``calibrate()`` run once, unthrottled, to measure it.
    """
    if kind == "cgroup":
        from fedcure_app.devices.cgroup import CgroupCpuBandwidth, CgroupError, find_cpu_controller

        if model is None:
            raise ValueError("the cgroup actuator needs the model name")
        try:
            controller = find_cpu_controller()
        except CgroupError as err:
            logger.warning("cgroup CPU control unavailable (%s); emulating the throttle instead",
                           err.strerror or err)
            return EmulatedThrottle(profile.f_max_ghz, profile.f_min_ghz)
        if host_sps is None:
            if calibrate is None:
                raise ValueError("the cgroup actuator needs host_sps or a calibrate function")
            host_sps = float(calibrate())
            logger.info("cgroup actuator: this host trains %s at %.0f samples/s on one core",
                        model, host_sps)
        try:
            return CgroupCpuBandwidth(profile, model, host_sps, name=cgroup_name,
                                      controller=controller)
        except CgroupError as err:
            logger.warning("cgroup CPU control unavailable (%s); emulating the throttle instead",
                           err.strerror or err)
            return EmulatedThrottle(profile.f_max_ghz, profile.f_min_ghz)
    if kind == "off":
        return NoThrottle(profile.f_max_ghz)
    if kind == "emulate":
        return EmulatedThrottle(profile.f_max_ghz, profile.f_min_ghz)
    if kind == "sysfs":
        try:
            act = SysfsCpufreq(root)
            act.check_writable()
            return act
        except (CpufreqPermissionError, CpufreqError) as err:
            logger.warning("cpufreq control unavailable (%s); emulating the throttle instead", err)
            return EmulatedThrottle(profile.f_max_ghz, profile.f_min_ghz)
    raise ValueError(f"unknown frequency control {kind!r}; choose {', '.join(ACTUATOR_KINDS)}")


def _meminfo(proc: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    text = _read_str(proc / "meminfo") or ""
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+):\s+(\d+)\s*kB", line.strip())
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return out


def _board_model(proc: Path) -> str | None:
    dt = proc / "device-tree" / "model"
    try:
        return dt.read_bytes().rstrip(b"\x00").decode(errors="replace").strip() or None
    except OSError:
        pass
    for line in (_read_str(proc / "cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware"):
            return value.strip() or None
    return None


def probe_device(root: str | Path = DEFAULT_CPU_ROOT, proc: str | Path = "/proc") -> dict[str, Any]:
    """What this machine offers: cores, per-CPU cpufreq data (GHz), governor, memory (bytes).

    Keys: ``machine``, ``model``, ``cores``, ``usable_cores``, ``cpufreq`` (cpu → available
    frequencies or min/max, governor, current, scaling max; empty without cpufreq),
    ``available_ghz`` (union), ``governor`` (of the first CPU, or None), ``memory_total_bytes``,
    ``memory_available_bytes`` (None when /proc/meminfo is unreadable).
    """
    root_p, proc_p = Path(root), Path(proc)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    cpufreq: dict[int, dict[str, Any]] = {}
    union: set[float] = set()
    for cpu, d in _cpu_dirs(root_p):
        avail = _read_str(d / "scaling_available_frequencies")
        freqs = []
        if avail:
            try:
                freqs = sorted({int(v) / 1e6 for v in avail.split()})
            except ValueError:
                freqs = []
        union.update(freqs)

        def ghz(name: str, _d: Path = d) -> float | None:
            v = _read_int(_d / name)
            return None if v is None else v / 1e6

        cpufreq[cpu] = {
            "available_ghz": freqs,
            "min_ghz": ghz("cpuinfo_min_freq"),
            "max_ghz": ghz("cpuinfo_max_freq"),
            "current_ghz": ghz("scaling_cur_freq"),
            "scaling_max_ghz": ghz("scaling_max_freq"),
            "governor": _read_str(d / "scaling_governor"),
            "writable": os.access(d / "scaling_max_freq", os.W_OK),
        }
    mem = _meminfo(proc_p)
    first = next(iter(cpufreq.values()), None)
    return {
        "machine": platform.machine(),
        "model": _board_model(proc_p),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "cpufreq": cpufreq,
        "available_ghz": sorted(union),
        "governor": first["governor"] if first else None,
        "memory_total_bytes": mem.get("MemTotal"),
        "memory_available_bytes": mem.get("MemAvailable"),
    }
