"""Device profiles: what the latency and energy model knows about a client device.

Units: frequencies in GHz, link rates in Mbit/s (10⁶ bit/s), work in CPU cycles, the energy
coefficient κ in J/(cycle·GHz²).

How the presets' numbers are derived
------------------------------------
``cycles_per_sample`` counts *device* cycles (all cores together, so that time = c/f): the FLOPs
of one training sample (forward + backward ≈ 3× forward, :func:`fedcure_app.models.
train_flops_per_sample`: digits 0.51 MFLOP, mnist 22.5 MFLOP, cifar10 195 MFLOP) divided by the
FLOPs the device retires per cycle when PyTorch trains that model at batch 32::

    cycles/sample = FLOPs/sample / (cores · peak FP32 FLOP/cycle/core · efficiency(model) · q)

- peak FP32 FLOP/cycle/core: Cortex-A53 4 (one 64-bit FMA/cycle), A57/A72 8 (one 128-bit
  FMA/cycle), A76/A78AE 16 (two), x86 with AVX2 + 2 FMA units 32;
- efficiency(model), the fraction of peak reached, measured on a 2-core x86 (AMD EPYC, AVX2,
  2.45 GHz, torch 2.13): digits 0.035 (overhead-bound), mnist 0.21, cifar10 0.60;
- q, the kernel quality relative to x86: 1.0 on x86, 0.6 on A72/A76/A78AE (PyTorch's ARM CPU
  kernels are less tuned), 0.5 on the older, lower-IPC A57 and the in-order A53; this gives
  e.g. ≈ 270 MNIST samples/s on a Raspberry Pi 4 at 1.5 GHz and ≈ 4 800 on the laptop at 4 GHz.

``kappa`` is fitted so that κ·f_max³·10⁹ W equals the CPU cluster's power above idle under an
all-core load at f_max (Pi 3 ≈ 4 W, Pi 4 ≈ 3.5 W, Pi 5 ≈ 6 W, Jetson Nano CPU rail ≈ 2.5 W,
Orin Nano CPU ≈ 4 W, laptop package ≈ 28 W). Link rates are typical Wi-Fi goodputs for each board.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


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
        if key.startswith("flops:"):
            # a user's model, known by its training FLOPs per sample: this device's cycles for
            # a model it knows (mnist first: mid-sized, its kernel efficiency in between),
            # scaled by the FLOPs ratio
            for ref in ("mnist", "cifar10", "digits"):
                if ref in self.cycles_per_sample:
                    return (self.cycles_per_sample[ref] * float(key[len("flops:"):])
                            / TRAIN_FLOPS_PER_SAMPLE[ref])
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
    # Raspberry Pi 3 Model B+: 4x Cortex-A53 (in-order, one 64-bit NEON pipe: 2 fp32 FMAs a
    # cycle), 0.6-1.4 GHz, on-board 802.11ac. Named only: not in the default draw.
    "rpi3": _preset("rpi3", cores=4, flops_per_cycle_core=4, quality=0.5, f_min_ghz=0.6,
                    f_max_ghz=1.4, power_w=4.0, uplink_mbps=20, downlink_mbps=40, jitter=0.2),
}

#: The presets :func:`sample_population` draws from when no mix is given (the simulator's
#: default population); a preset added later joins by name only, so that the default
#: population, and every result simulated with it, stays as it was.
DEFAULT_DRAW: tuple[str, ...] = ("rpi4", "rpi5", "jetson-nano", "jetson-orin-nano", "laptop")


def sample_population(
    n: int, seed: int = 0, mix: Mapping[str, float] | Sequence[str] | None = None
) -> list[DeviceProfile]:
    """``n`` device profiles drawn from :data:`PRESETS` with a seeded RNG.

    ``mix``: preset name → weight (normalised), or a list of names drawn uniformly; default the
    :data:`DEFAULT_DRAW` presets uniformly. Profiles are shared (frozen) preset objects.
    """
    if int(n) != n or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if mix is None:
        names, weights = list(DEFAULT_DRAW), [1.0] * len(DEFAULT_DRAW)
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
    import numpy as np  # here: the client role reads profiles without NumPy

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
