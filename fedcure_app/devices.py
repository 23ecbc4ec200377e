"""Device profiles, the latency and energy model, and CPU-frequency actuators.

Units throughout: frequencies in GHz, times in seconds, sizes in bytes, link rates in Mbit/s
(10⁶ bit/s), work in CPU cycles, energy in joules.

Latency and energy model (``DESIGN.md``)
----------------------------------------
- compute: ``c / (f·10⁹)`` s for ``c`` cycles at ``f`` GHz;
- a client's edge round: ``c_n/f_n`` plus the model going down and coming back up its link,
  ``8·B/(down·10⁶) + 8·B/(up·10⁶)`` s, times a mean-one lognormal jitter factor in simulation;
- an edge round lasts as long as its slowest client; a coalition's global task is τ_e edge rounds
  plus the edge↔cloud transfers;
- energy: ``κ_n·c_n·f_n²`` J, with κ in J/(cycle·GHz²) (so dynamic power is ``κ·f³·10⁹`` W).

How the presets' numbers are derived
------------------------------------
``cycles_per_sample`` counts *device* cycles (all cores together, so that time = c/f): the FLOPs
of one training sample (forward + backward ≈ 3× forward, :func:`fedcure_app.models.
train_flops_per_sample`: digits 0.51 MFLOP, mnist 22.5 MFLOP, cifar10 195 MFLOP) divided by the
FLOPs the device retires per cycle when PyTorch trains that model at batch 32::

    cycles/sample = FLOPs/sample / (cores · peak FP32 FLOP/cycle/core · efficiency(model) · q)

- peak FP32 FLOP/cycle/core: Cortex-A57/A72 8 (one 128-bit FMA/cycle), A76/A78AE 16 (two),
  x86 with AVX2 + 2 FMA units 32;
- efficiency(model), the fraction of peak reached, measured on a 2-core x86 (AMD EPYC, AVX2,
  2.45 GHz, torch 2.13): digits 0.035 (overhead-bound), mnist 0.21, cifar10 0.60;
- q, the kernel quality relative to x86: 1.0 on x86, 0.6 on A72/A76/A78AE (PyTorch's ARM CPU
  kernels are less tuned), 0.5 on the older, lower-IPC A57; this gives e.g. ≈ 270 MNIST
  samples/s on a Raspberry Pi 4 at 1.5 GHz and ≈ 4 800 on the laptop at 4 GHz.

``kappa`` is fitted so that κ·f_max³·10⁹ W equals the CPU cluster's power above idle under an
all-core load at f_max (Pi 4 ≈ 3.5 W, Pi 5 ≈ 6 W, Jetson Nano CPU rail ≈ 2.5 W, Orin Nano CPU
≈ 4 W, laptop package ≈ 28 W). Link rates are typical Wi-Fi goodputs for each board.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import platform
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

logger = logging.getLogger(__name__)

DEFAULT_CPU_ROOT = "/sys/devices/system/cpu"

#: Datasets that share another dataset's CNN (and so its cycles per sample).
MODEL_ALIASES: dict[str, str] = {"svhn": "cifar10", "cinic10": "cifar10"}

#: FLOPs of one training sample (forward + backward) of each CNN in :mod:`fedcure_app.models`.
TRAIN_FLOPS_PER_SAMPLE: dict[str, int] = {
    "digits": 505_344,
    "mnist": 22_487_040,
    "cifar10": 195_367_680,
}

#: Fraction of peak FP32 throughput PyTorch reaches training each CNN at batch 32 (measured, x86).
KERNEL_EFFICIENCY: dict[str, float] = {"digits": 0.035, "mnist": 0.21, "cifar10": 0.60}

_PositiveFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class DeviceProfile(BaseModel):
    """What the latency and energy model needs to know about one client device.

    - ``f_min_ghz``/``f_max_ghz``: the CPU's frequency range (GHz);
    - ``cycles_per_sample``: model name → device CPU cycles per training sample, forward and
      backward (``svhn`` and ``cinic10`` fall back to ``cifar10``);
    - ``uplink_mbps``/``downlink_mbps``: link rates to the edge server (Mbit/s);
    - ``kappa``: energy coefficient κ in J/(cycle·GHz²): energy = κ·c·f² J for c cycles at f GHz;
    - ``jitter``: relative standard deviation of the latency noise (0 = deterministic).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    f_min_ghz: _PositiveFloat
    f_max_ghz: _PositiveFloat
    cycles_per_sample: dict[str, _PositiveFloat]
    uplink_mbps: _PositiveFloat
    downlink_mbps: _PositiveFloat
    kappa: _PositiveFloat
    jitter: float = Field(0.1, ge=0.0, le=5.0, allow_inf_nan=False)

    @field_validator("cycles_per_sample")
    @classmethod
    def _some_model(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("needs cycles for at least one model")
        return v

    @model_validator(mode="after")
    def _range(self) -> "DeviceProfile":
        if self.f_min_ghz > self.f_max_ghz:
            raise ValueError(
                f"f_min_ghz ({self.f_min_ghz}) must not exceed f_max_ghz ({self.f_max_ghz})"
            )
        return self

    def cycles_for(self, model: str) -> float:
        """CPU cycles per training sample of ``model`` (a dataset or architecture name)."""
        key = model.lower()
        if key in self.cycles_per_sample:
            return self.cycles_per_sample[key]
        alias = MODEL_ALIASES.get(key)
        if alias is not None and alias in self.cycles_per_sample:
            return self.cycles_per_sample[alias]
        raise KeyError(
            f"device profile {self.name!r} has no cycles for model {model!r}; "
            f"it knows {', '.join(sorted(self.cycles_per_sample))}"
        )

    def clamp(self, f_ghz: float) -> float:
        """``f_ghz`` clamped to [f_min_ghz, f_max_ghz]."""
        return min(self.f_max_ghz, max(self.f_min_ghz, float(f_ghz)))


class ProfileError(ValueError):
    """A device-profile file or entry that cannot be used, phrased as one actionable line."""


def _preset(
    name: str,
    *,
    cores: int,
    flops_per_cycle_core: float,
    quality: float,
    f_min_ghz: float,
    f_max_ghz: float,
    power_w: float,
    uplink_mbps: float,
    downlink_mbps: float,
    jitter: float,
) -> DeviceProfile:
    """A profile from a CPU's published figures (see the module docstring for the derivation)."""
    per_cycle = cores * flops_per_cycle_core * quality
    cycles = {
        m: round(TRAIN_FLOPS_PER_SAMPLE[m] / (per_cycle * KERNEL_EFFICIENCY[m]))
        for m in TRAIN_FLOPS_PER_SAMPLE
    }
    return DeviceProfile(
        name=name,
        f_min_ghz=f_min_ghz,
        f_max_ghz=f_max_ghz,
        cycles_per_sample=cycles,
        uplink_mbps=uplink_mbps,
        downlink_mbps=downlink_mbps,
        kappa=power_w / (f_max_ghz**3 * 1e9),
        jitter=jitter,
    )


#: Built-in profiles of common edge devices (published CPU clocks; derivation in the docstring).
PRESETS: dict[str, DeviceProfile] = {
    # Raspberry Pi 4 Model B: 4x Cortex-A72, 0.6-1.5 GHz, on-board 802.11ac.
    "rpi4": _preset("rpi4", cores=4, flops_per_cycle_core=8, quality=0.6, f_min_ghz=0.6,
                    f_max_ghz=1.5, power_w=3.5, uplink_mbps=25, downlink_mbps=50, jitter=0.15),
    # Raspberry Pi 5: 4x Cortex-A76, 1.5-2.4 GHz, on-board 802.11ac.
    "rpi5": _preset("rpi5", cores=4, flops_per_cycle_core=16, quality=0.6, f_min_ghz=1.5,
                    f_max_ghz=2.4, power_w=6.0, uplink_mbps=40, downlink_mbps=80, jitter=0.15),
    # Jetson Nano (CPU only): 4x Cortex-A57, 0.102-1.43 GHz, USB Wi-Fi.
    "jetson-nano": _preset("jetson-nano", cores=4, flops_per_cycle_core=8, quality=0.5,
                           f_min_ghz=0.102, f_max_ghz=1.43, power_w=2.5, uplink_mbps=20,
                           downlink_mbps=40, jitter=0.15),
    # Jetson Orin Nano (CPU only): 6x Cortex-A78AE, 0.115-1.5 GHz, M.2 Wi-Fi.
    "jetson-orin-nano": _preset("jetson-orin-nano", cores=6, flops_per_cycle_core=16,
                                quality=0.6, f_min_ghz=0.115, f_max_ghz=1.5, power_w=4.0,
                                uplink_mbps=50, downlink_mbps=100, jitter=0.15),
    # Laptop: 4-core x86 with AVX2/FMA, 0.8-4.0 GHz, Wi-Fi 6.
    "laptop": _preset("laptop", cores=4, flops_per_cycle_core=32, quality=1.0, f_min_ghz=0.8,
                      f_max_ghz=4.0, power_w=28.0, uplink_mbps=100, downlink_mbps=200,
                      jitter=0.1),
}


def sample_population(
    n: int, seed: int = 0, mix: Mapping[str, float] | Sequence[str] | None = None
) -> list[DeviceProfile]:
    """``n`` device profiles drawn from :data:`PRESETS` with a seeded RNG.

    ``mix``: preset name → weight (normalised), or a list of names drawn uniformly; default all
    presets uniformly. Profiles are shared (frozen) preset objects.
    """
    if int(n) != n or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if mix is None:
        names, weights = list(PRESETS), [1.0] * len(PRESETS)
    elif isinstance(mix, Mapping):
        names, weights = list(mix), [float(w) for w in mix.values()]
    else:
        names = [str(m) for m in mix]
        weights = [1.0] * len(names)
    unknown = [m for m in names if m not in PRESETS]
    if unknown:
        raise ValueError(
            f"unknown device preset(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(PRESETS)}"
        )
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or np.any(~np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(
            f"mix weights must be finite, non-negative and not all zero, got {weights}"
        )
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(names), size=int(n), p=w / w.sum())
    return [PRESETS[names[i]] for i in picks]


def _validation_line(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "profile"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_profile(data: Mapping[str, Any], *, default_name: str | None = None) -> DeviceProfile:
    """Validate one profile mapping; ``{"preset": "rpi4", ...}`` starts from a preset and overrides.

    Raises :class:`ProfileError`.
    """
    if not isinstance(data, Mapping):
        raise ProfileError(f"a profile must be a table/object, got {type(data).__name__}")
    fields = dict(data)
    preset = fields.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise ProfileError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        base = PRESETS[preset].model_dump()
        base["name"] = default_name or preset
        base.update(fields)
        fields = base
    elif "name" not in fields and default_name is not None:
        fields["name"] = default_name
    try:
        return DeviceProfile.model_validate(fields)
    except ValidationError as err:
        raise ProfileError(_validation_line(err)) from None


def load_profiles(path: str | Path) -> list[DeviceProfile]:
    """Read device profiles from a JSON or TOML file.

    Accepted shapes: a list of profiles; a mapping name → profile (the key is the default name);
    or either under a top-level ``profiles`` key (the only way to write a list in TOML:
    ``[[profiles]]``). Raises :class:`ProfileError` naming the file and the entry.
    """
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"device profile file not found: {p}")
    suffix = p.suffix.lower()
    try:
        text = p.read_text()
        if suffix == ".json":
            data: Any = json.loads(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ProfileError(f"{p}: unsupported profile file type {suffix!r}; use .json or .toml")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ProfileError(f"cannot parse {p}: {err}") from None
    if isinstance(data, Mapping) and "profiles" in data:
        data = data["profiles"]
    if isinstance(data, Mapping):
        entries: list[tuple[str | None, Any]] = [(str(k), v) for k, v in data.items()]
    elif isinstance(data, list):
        entries = [(None, v) for v in data]
    else:
        raise ProfileError(
            f"{p}: expected a list or a mapping of profiles, got {type(data).__name__}"
        )
    if not entries:
        raise ProfileError(f"{p}: no device profiles in the file")
    out = []
    for i, (key, entry) in enumerate(entries):
        try:
            out.append(parse_profile(entry, default_name=key))
        except ProfileError as err:
            label = f"profile {key!r}" if key is not None else f"profile #{i}"
            raise ProfileError(f"{p}: {label}: {err}") from None
    return out


# ---------------------------------------------------------------------------------------------
# Latency and energy arithmetic
# ---------------------------------------------------------------------------------------------


def _check_positive(name: str, value: Any) -> None:
    arr = np.asarray(value, dtype=np.float64)
    if not np.all(arr > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")


def compute_seconds(cycles: float | np.ndarray, f_ghz: float | np.ndarray) -> float | np.ndarray:
    """Seconds to run ``cycles`` CPU cycles at ``f_ghz`` GHz: c / (f·10⁹)."""
    _check_positive("f_ghz", f_ghz)
    if isinstance(cycles, np.ndarray) or isinstance(f_ghz, np.ndarray):
        return np.asarray(cycles, dtype=np.float64) / (np.asarray(f_ghz, dtype=np.float64) * 1e9)
    return float(cycles) / (float(f_ghz) * 1e9)


def transfer_seconds(num_bytes: float | np.ndarray, mbps: float | np.ndarray) -> float | np.ndarray:
    """Seconds to move ``num_bytes`` bytes over a ``mbps`` Mbit/s link: 8·B / (mbps·10⁶)."""
    _check_positive("mbps", mbps)
    if isinstance(num_bytes, np.ndarray) or isinstance(mbps, np.ndarray):
        bits = 8.0 * np.asarray(num_bytes, dtype=np.float64)
        return bits / (np.asarray(mbps, dtype=np.float64) * 1e6)
    return 8.0 * float(num_bytes) / (float(mbps) * 1e6)


def jitter_factor(
    rng: np.random.Generator, sigma: float | np.ndarray, size: int | None = None
) -> float | np.ndarray:
    """Mean-one lognormal noise factor exp(σ·z − σ²/2), z ~ N(0, 1); σ is the relative jitter.

    One normal draw per factor whatever σ is (σ = 0 gives exactly 1), so the RNG stream does not
    depend on the profiles' jitter values.
    """
    z = rng.standard_normal(size)
    s = np.asarray(sigma, dtype=np.float64)
    out = np.exp(s * z - 0.5 * s * s)
    return float(out) if size is None and np.ndim(out) == 0 else out


def client_round_seconds(
    profile: DeviceProfile,
    model: str,
    samples_per_round: int,
    model_bytes: int,
    f_ghz: float,
    rng: np.random.Generator | None = None,
) -> float:
    """One client's edge-round latency (s): compute + model down and up, times jitter if ``rng``.

    ``samples_per_round`` = τ_c · batch size; ``model_bytes`` the model's size (bytes);
    ``f_ghz`` the frequency it runs at (clamp with :meth:`DeviceProfile.clamp` first).
    """
    cycles = profile.cycles_for(model) * samples_per_round
    t = compute_seconds(cycles, f_ghz)
    t += transfer_seconds(model_bytes, profile.downlink_mbps)
    t += transfer_seconds(model_bytes, profile.uplink_mbps)
    if rng is not None:
        t *= jitter_factor(rng, profile.jitter)
    return float(t)


def edge_round_seconds(client_seconds: Iterable[float] | np.ndarray) -> float:
    """An edge round's latency (s): its slowest client's."""
    if not isinstance(client_seconds, np.ndarray):
        client_seconds = list(client_seconds)
    arr = np.asarray(client_seconds, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("an edge round needs at least one client")
    return float(arr.max())


def coalition_seconds(
    edge_rounds: float | Sequence[float] | np.ndarray,
    edge_cloud_bytes: int,
    edge_link_mbps: float,
    *,
    tau_e: int | None = None,
    transfers: int = 2,
) -> float:
    """A coalition's global-task latency (s): τ_e edge rounds plus the edge↔cloud transfers.

    ``edge_rounds``: every edge round's latency (summed), or one per-round latency with ``tau_e``
    (multiplied). ``transfers`` models of ``edge_cloud_bytes`` bytes cross the edge↔cloud link
    at ``edge_link_mbps`` (default 2: the global model down, the edge model up).
    """
    if tau_e is not None:
        if np.ndim(edge_rounds) != 0:
            raise ValueError("give a single per-round latency together with tau_e")
        if tau_e < 1:
            raise ValueError(f"tau_e must be >= 1, got {tau_e}")
        compute = tau_e * float(edge_rounds)  # type: ignore[arg-type]
    else:
        arr = np.asarray(edge_rounds, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError("give the list of edge-round latencies, or one latency with tau_e")
        compute = float(arr.sum())
    if transfers < 0:
        raise ValueError(f"transfers must be >= 0, got {transfers}")
    return compute + transfers * float(transfer_seconds(edge_cloud_bytes, edge_link_mbps))


def energy_joules(profile: DeviceProfile, cycles: float, f_ghz: float) -> float:
    """Energy (J) of ``cycles`` CPU cycles at ``f_ghz`` GHz on ``profile``: κ·c·f²."""
    _check_positive("f_ghz", f_ghz)
    return float(profile.kappa * cycles * f_ghz * f_ghz)


@dataclass(frozen=True)
class PopulationArrays:
    """A population's profile fields as numpy arrays, for one model: vectorised latency/energy.

    All arrays have shape (n,); ``cycles_per_sample`` is for ``model``.
    """

    model: str
    f_min_ghz: np.ndarray
    f_max_ghz: np.ndarray
    cycles_per_sample: np.ndarray
    uplink_mbps: np.ndarray
    downlink_mbps: np.ndarray
    kappa: np.ndarray
    jitter: np.ndarray

    @classmethod
    def from_profiles(cls, profiles: Sequence[DeviceProfile], model: str) -> "PopulationArrays":
        """Stack ``profiles`` (one per client, in client order) for ``model``."""
        if not profiles:
            raise ValueError("empty population")

        def col(attr: str) -> np.ndarray:
            return np.array([getattr(p, attr) for p in profiles], dtype=np.float64)

        return cls(
            model=model,
            f_min_ghz=col("f_min_ghz"),
            f_max_ghz=col("f_max_ghz"),
            cycles_per_sample=np.array([p.cycles_for(model) for p in profiles], dtype=np.float64),
            uplink_mbps=col("uplink_mbps"),
            downlink_mbps=col("downlink_mbps"),
            kappa=col("kappa"),
            jitter=col("jitter"),
        )

    def __len__(self) -> int:
        return int(self.f_max_ghz.shape[0])

    def clamp(self, f_ghz: np.ndarray | float) -> np.ndarray:
        """Frequencies (GHz) clamped to each device's range."""
        return np.clip(np.asarray(f_ghz, dtype=np.float64), self.f_min_ghz, self.f_max_ghz)

    def cycles(self, samples: np.ndarray | int) -> np.ndarray:
        """CPU cycles to train ``samples`` samples on each device."""
        return self.cycles_per_sample * np.asarray(samples, dtype=np.float64)

    def round_seconds(
        self,
        samples: np.ndarray | int,
        model_bytes: int,
        f_ghz: np.ndarray | float,
        rng: np.random.Generator | None = None,
        idx: np.ndarray | None = None,
    ) -> np.ndarray:
        """Edge-round latency (s) of every device (or the subset ``idx``), as
        :func:`client_round_seconds`; one jitter draw per device, in order, when ``rng`` is given.
        """
        sel = slice(None) if idx is None else np.asarray(idx)
        f = np.asarray(f_ghz, dtype=np.float64)
        _check_positive("f_ghz", f)
        t = self.cycles_per_sample[sel] * np.asarray(samples, dtype=np.float64) / (f * 1e9)
        t = t + 8.0 * model_bytes / (self.downlink_mbps[sel] * 1e6)
        t = t + 8.0 * model_bytes / (self.uplink_mbps[sel] * 1e6)
        if rng is not None:
            sigma = self.jitter[sel]
            t = t * jitter_factor(rng, sigma, size=np.shape(sigma)[0])
        return t

    def energy_joules(self, samples: np.ndarray | int, f_ghz: np.ndarray | float,
                      idx: np.ndarray | None = None) -> np.ndarray:
        """Energy (J) of training ``samples`` samples at ``f_ghz`` on every device (or ``idx``)."""
        sel = slice(None) if idx is None else np.asarray(idx)
        f = np.asarray(f_ghz, dtype=np.float64)
        _check_positive("f_ghz", f)
        cycles = self.cycles_per_sample[sel] * np.asarray(samples, np.float64)
        return self.kappa[sel] * cycles * f * f


# ---------------------------------------------------------------------------------------------
# CPU-frequency actuators
# ---------------------------------------------------------------------------------------------


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
        self._available_khz: dict[int, np.ndarray | None] = {}
        self._range_khz: dict[int, tuple[int, int]] = {}
        for c, d in self._dirs.items():
            avail = _read_str(d / "scaling_available_frequencies")
            freqs = None
            if avail:
                try:
                    freqs = np.array(sorted({int(v) for v in avail.split()}), dtype=np.int64)
                except ValueError:
                    raise CpufreqError(
                        errno.EINVAL, f"cannot parse {d / 'scaling_available_frequencies'}"
                    ) from None
            lo = _read_int(d / "cpuinfo_min_freq")
            hi = _read_int(d / "cpuinfo_max_freq")
            if freqs is not None and freqs.size:
                lo, hi = int(freqs[0]), int(freqs[-1])
            elif lo is None or hi is None:
                raise CpufreqError(
                    errno.ENOENT,
                    f"{d}: neither scaling_available_frequencies nor cpuinfo_min/max_freq readable",
                )
            self._available_khz[c] = freqs if freqs is not None and freqs.size else None
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
        return None if freqs is None else [int(f) / 1e6 for f in freqs]

    def target_khz(self, cpu: int, f_ghz: float) -> int:
        """The value (kHz) that :meth:`apply` writes for ``cpu`` given ``f_ghz``."""
        want = _check_frequency(f_ghz) * 1e6
        freqs = self._available_khz[cpu]
        if freqs is None:
            lo, hi = self._range_khz[cpu]
            return int(min(hi, max(lo, round(want))))
        return int(freqs[int(np.argmin(np.abs(freqs - want)))])

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


ActuatorKind = Literal["sysfs", "emulate", "off"]


def make_actuator(
    kind: str, profile: DeviceProfile, *, root: str | Path = DEFAULT_CPU_ROOT
) -> FrequencyActuator:
    """The actuator for ``kind`` (``sysfs``, ``emulate`` or ``off``) on a device ``profile``.

    ``sysfs`` falls back to :class:`EmulatedThrottle` with a logged warning when cpufreq is
    absent or not writable.
    """
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
    raise ValueError(f"unknown frequency control {kind!r}; choose sysfs, emulate or off")


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
