"""Device profiles, the latency and energy model, and CPU-frequency actuators.

Four modules, one job each; every public name is importable from ``fedcure_app.devices``:

- :mod:`~fedcure_app.devices.profiles`: :class:`DeviceProfile`, the built-in :data:`PRESETS`,
  sampling a population, reading profile files;
- :mod:`~fedcure_app.devices.latency`: compute and transfer times, jitter, a client's edge
  round, a coalition's task, energy, and their vectorised forms (:class:`PopulationArrays`);
- :mod:`~fedcure_app.devices.cpufreq`: the actuators that apply a frequency directive (cpufreq
  sysfs, emulated, off) and :func:`probe_device`;
- :mod:`~fedcure_app.devices.cgroup`: the CPU-bandwidth actuator (a cgroup quota that makes
  this host compute at a profile's speed at f).

Units throughout: frequencies in GHz, times in seconds, sizes in bytes, link rates in Mbit/s
(10⁶ bit/s), work in CPU cycles, energy in joules.
"""

from typing import TYPE_CHECKING, Any

from fedcure_app.devices.cgroup import (
    CgroupCpuBandwidth,
    CgroupError,
    calibrate_host,
    find_cpu_controller,
    plan_quota,
    remove_cgroups,
)
from fedcure_app.devices.cpufreq import (
    ACTUATOR_KINDS,
    DEFAULT_CPU_ROOT,
    ActuatorKind,
    CpufreqError,
    CpufreqPermissionError,
    EmulatedThrottle,
    FrequencyActuator,
    NoThrottle,
    SysfsCpufreq,
    make_actuator,
    probe_device,
)
from fedcure_app.devices.profiles import (
    DEFAULT_DRAW,
    KERNEL_EFFICIENCY,
    MODEL_ALIASES,
    PRESETS,
    TRAIN_FLOPS_PER_SAMPLE,
    DeviceProfile,
    ProfileError,
    load_profiles,
    parse_profile,
    sample_population,
)

if TYPE_CHECKING:
    from fedcure_app.devices.latency import (
        PopulationArrays,
        access_caps,
        client_round_seconds,
        coalition_seconds,
        compute_seconds,
        edge_round_seconds,
        energy_joules,
        jitter_factor,
        transfer_seconds,
    )

#: names of :mod:`~fedcure_app.devices.latency` (the one module that needs NumPy), imported on
#: first use so that the client role, which reads profiles and drives actuators, loads no NumPy
_LATENCY_NAMES = frozenset({
    "PopulationArrays", "access_caps", "client_round_seconds", "coalition_seconds",
    "compute_seconds", "edge_round_seconds", "energy_joules", "jitter_factor",
    "transfer_seconds",
})


def __getattr__(name: str) -> Any:
    if name in _LATENCY_NAMES:
        from fedcure_app.devices import latency

        return getattr(latency, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTUATOR_KINDS", "CgroupCpuBandwidth", "CgroupError", "calibrate_host",
    "find_cpu_controller", "plan_quota", "remove_cgroups",
    "DEFAULT_CPU_ROOT", "DEFAULT_DRAW", "KERNEL_EFFICIENCY", "MODEL_ALIASES", "PRESETS",
    "TRAIN_FLOPS_PER_SAMPLE",
    "ActuatorKind", "CpufreqError", "CpufreqPermissionError", "DeviceProfile", "EmulatedThrottle",
    "FrequencyActuator", "NoThrottle", "PopulationArrays", "ProfileError", "SysfsCpufreq",
    "access_caps", "client_round_seconds", "coalition_seconds", "compute_seconds",
    "edge_round_seconds",
    "energy_joules", "jitter_factor", "load_profiles", "make_actuator", "parse_profile",
    "probe_device", "sample_population", "transfer_seconds",
]
