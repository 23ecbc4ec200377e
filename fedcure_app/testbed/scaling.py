"""Pure scaling of device profiles to what one host can give its testbed clients.

A testbed client computes at most on one host core (its trainer has one torch thread), and all
clients share the host's cores: in round 0 every coalition trains at once. A device that is
faster than the host, or a mix whose quotas at f_max add up to more than the host's cores less
the roles' reserve, cannot run true to its profile. :func:`scale_profiles` slows every profile
by one common factor (its cycles per sample raised), so that the devices keep their speed
ratios and the clients' quotas at f_max fit the host:

- ``client_cores=None`` (auto): the largest factor ≤ 1 under which no client asks more than one
  host core and all of them together ask at most ``host_cores − reserve``;
- ``client_cores=C``: the fastest client computes on C host cores (C in (0, 1]).

Speeds in training samples per second, shares of a host core as fractions (1.0 = one core).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fedcure_app.devices.cgroup import MIN_FRACTION, ROLE_RESERVE_CORES
from fedcure_app.devices.profiles import DeviceProfile, parse_profile


@dataclass(frozen=True)
class Scaling:
    """The result of :func:`scale_profiles`.

    ``factor``: every profile's speed multiplier (≤ 1 slows); ``cores``: each client's share of
    a host core at f_max after scaling; ``below_floor``: names of the profiles whose share fell
    under the CPU actuator's smallest quota (they run faster than their profile says).
    """

    profiles: tuple[DeviceProfile, ...]
    factor: float
    cores: tuple[float, ...]
    below_floor: tuple[str, ...]

    @property
    def total_cores(self) -> float:
        """Host cores the clients ask together at f_max (each at least the floor)."""
        return float(sum(max(MIN_FRACTION, c) for c in self.cores))


def host_cores_at_fmax(profile: DeviceProfile, model: str, host_sps: float) -> float:
    """``profile``'s speed at f_max as a share of one host core (unbounded: 2.0 = twice one
    core)."""
    if not (math.isfinite(host_sps) and host_sps > 0):
        raise ValueError(f"host speed must be a finite number > 0 samples/s, got {host_sps!r}")
    return profile.f_max_ghz * 1e9 / profile.cycles_for(model) / host_sps


def scale_factor(shares: Sequence[float], host_cores: float, client_cores: float | None = None,
                 reserve: float = ROLE_RESERVE_CORES) -> float:
    """The common speed factor for clients asking ``shares`` host cores at f_max (see the
    module docstring); raises ``ValueError`` on a share ≤ 0 or a ``client_cores`` outside
    (0, 1]."""
    if not shares or min(shares) <= 0 or not all(math.isfinite(s) for s in shares):
        raise ValueError("every client's share must be a finite number > 0")
    if client_cores is not None:
        if not 0 < client_cores <= 1:
            raise ValueError(f"client cores must be in (0, 1], got {client_cores!r}")
        return client_cores / max(shares)
    # a hair under the room, so that rounding cannot tip the sum over it
    room = max(host_cores - reserve, MIN_FRACTION * len(shares)) * (1 - 1e-9)
    return min(1.0, 1.0 / max(shares), room / sum(shares))


def scale_profiles(profiles: Sequence[DeviceProfile], model: str, host_sps: float,
                   host_cores: float, client_cores: float | None = None,
                   reserve: float = ROLE_RESERVE_CORES) -> Scaling:
    """``profiles`` slowed by one common factor to fit this host (see the module docstring);
    a factor of 1 returns them unchanged."""
    shares = [host_cores_at_fmax(p, model, host_sps) for p in profiles]
    factor = scale_factor(shares, host_cores, client_cores, reserve)
    key = model.lower()
    out = []
    for p in profiles:
        if factor == 1.0:
            out.append(p)
            continue
        cycles = dict(p.cycles_per_sample)
        cycles[key] = p.cycles_for(model) / factor
        out.append(parse_profile({**p.model_dump(), "cycles_per_sample": cycles}))
    cores = tuple(s * factor for s in shares)
    low = tuple(sorted({p.name for p, c in zip(out, cores) if c < MIN_FRACTION}))
    return Scaling(tuple(out), float(factor), cores, low)


__all__ = ["Scaling", "host_cores_at_fmax", "scale_factor", "scale_profiles"]
