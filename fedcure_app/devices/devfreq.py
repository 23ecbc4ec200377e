"""The GPU-clock actuator: the cloud's frequency directive applied to a GPU through devfreq.

Jetson boards expose the GPU clock as a Linux devfreq device,
``/sys/class/devfreq/<gpu>/{available_frequencies,min_freq,max_freq,cur_freq}`` (Hz). The
directive f* is a CPU frequency of the client's device profile; :class:`SysfsDevfreq` takes it
as a fraction of the profile's range, (f* − f_min)/(f_max − f_min), maps that fraction onto the
GPU's range of available frequencies and pins ``min_freq`` and ``max_freq`` to the available
frequency nearest it. It reports the GPU frequency applied (Hz). :func:`make_gpu_actuator`
returns None (and logs one line saying why) where the tree is missing or not writable.
"""

from __future__ import annotations

import errno
import logging
import math
from pathlib import Path

from fedcure_app.devices.cpufreq import (
    CpufreqError,
    CpufreqPermissionError,
    _write_sysfs,
    nearest,
)

logger = logging.getLogger("fedcure_app.devices")

#: where the kernel lists devfreq devices
DEFAULT_DEVFREQ_ROOT = "/sys/class/devfreq"
#: name fragments of GPU devfreq devices (Jetson: 17000000.gv11b, 57000000.gpu, gpu.0, ...)
GPU_NAMES: tuple[str, ...] = ("gpu", "gv11b", "gp10b", "ga10b", "gm20b")


def find_gpu(root: str | Path = DEFAULT_DEVFREQ_ROOT) -> Path:
    """The devfreq folder of the GPU under ``root``; :class:`CpufreqError` when none is there."""
    base = Path(root)
    if not base.is_dir():
        raise CpufreqError(errno.ENOENT, f"no devfreq folder {base}")
    for d in sorted(base.iterdir()):
        if any(n in d.name.lower() for n in GPU_NAMES) and (d / "max_freq").exists():
            return d
    raise CpufreqError(errno.ENOENT, f"no GPU devfreq device under {base}")


class SysfsDevfreq:
    """Pins a GPU's devfreq clock to the available frequency nearest a directive's fraction."""

    def __init__(self, device: str | Path, f_min_ghz: float, f_max_ghz: float) -> None:
        self.dir = Path(device)
        if not (math.isfinite(f_min_ghz) and math.isfinite(f_max_ghz) and
                0 < f_min_ghz <= f_max_ghz):
            raise ValueError(f"profile range {f_min_ghz}..{f_max_ghz} GHz is not a range")
        self.f_min_ghz, self.f_max_ghz = float(f_min_ghz), float(f_max_ghz)
        try:
            text = (self.dir / "available_frequencies").read_text()
            self.available_hz = sorted({int(v) for v in text.split()})
        except (OSError, ValueError) as err:
            raise CpufreqError(errno.ENOENT, f"cannot read {self.dir / 'available_frequencies'}:"
                               f" {getattr(err, 'strerror', None) or err}") from None
        if not self.available_hz:
            raise CpufreqError(errno.ENOENT, f"{self.dir / 'available_frequencies'} is empty")
        #: the frequency last pinned (Hz), None before the first directive
        self.applied_hz: int | None = None

    def target_hz(self, f_ghz: float) -> int:
        """The available GPU frequency (Hz) for directive ``f_ghz`` (GHz of the CPU profile)."""
        f = float(f_ghz)
        if not (math.isfinite(f) and f > 0):
            raise ValueError(f"frequency must be a finite number > 0 GHz, got {f_ghz!r}")
        span = self.f_max_ghz - self.f_min_ghz
        frac = 1.0 if span == 0 else min(1.0, max(0.0, (f - self.f_min_ghz) / span))
        lo, hi = self.available_hz[0], self.available_hz[-1]
        want = lo + frac * (hi - lo)
        return nearest(self.available_hz, want)

    def apply(self, f_ghz: float) -> int:
        """Pin ``min_freq`` and ``max_freq`` to :meth:`target_hz`; the frequency applied (Hz).
        The order keeps min ≤ max at every moment (the kernel refuses otherwise)."""
        hz = self.target_hz(f_ghz)
        current_max = _read_hz(self.dir / "max_freq")
        first, second = (("max_freq", "min_freq") if current_max is not None and hz < current_max
                         else ("min_freq", "max_freq"))
        if first == "min_freq":
            _write_sysfs(self.dir / "max_freq", str(max(hz, current_max or hz)))
        _write_sysfs(self.dir / first, str(hz))
        _write_sysfs(self.dir / second, str(hz))
        self.applied_hz = hz
        logger.debug("devfreq %s: directive %.3f GHz -> %d Hz", self.dir.name, f_ghz, hz)
        return hz

    def check_writable(self) -> None:
        """Write ``max_freq`` back unchanged; raises :class:`CpufreqPermissionError` when not
        allowed."""
        current = _read_hz(self.dir / "max_freq")
        _write_sysfs(self.dir / "max_freq", str(current if current is not None
                                                 else self.available_hz[-1]))


def _read_hz(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def make_gpu_actuator(kind: str, f_min_ghz: float, f_max_ghz: float,
                      root: str | Path = DEFAULT_DEVFREQ_ROOT) -> SysfsDevfreq | None:
    """The GPU actuator for ``--gpufreq kind`` (``devfreq`` or ``off``); None for ``off`` and,
    with one warning line saying why, where the devfreq tree is missing or read-only."""
    if kind == "off":
        return None
    if kind != "devfreq":
        raise ValueError(f"unknown GPU frequency control {kind!r}; choose devfreq or off")
    try:
        act = SysfsDevfreq(find_gpu(root), f_min_ghz, f_max_ghz)
        act.check_writable()
        return act
    except (CpufreqError, CpufreqPermissionError) as err:
        logger.warning("GPU devfreq control unavailable (%s); the GPU clock stays as it is", err)
        return None


__all__ = ["DEFAULT_DEVFREQ_ROOT", "SysfsDevfreq", "find_gpu", "make_gpu_actuator"]
