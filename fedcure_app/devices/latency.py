"""The latency and energy model of a client device (docs/DESIGN.md, "Latency model").

Units: frequencies in GHz, times in seconds, sizes in bytes, link rates in Mbit/s (10⁶ bit/s),
work in CPU cycles, energy in joules.

- compute: ``c / (f·10⁹)`` s for ``c`` cycles at ``f`` GHz;
- a client's edge round: ``c_n/f_n`` plus the model going down and coming back up its link,
  ``8·B/(down·10⁶) + 8·B/(up·10⁶)`` s, times a mean-one lognormal jitter factor in simulation;
- an edge round lasts as long as its slowest client; a coalition's global task is τ_e edge rounds
  plus the edge↔cloud transfers;
- energy: ``κ_n·c_n·f_n²`` J, with κ in J/(cycle·GHz²) (so dynamic power is ``κ·f³·10⁹`` W).

:class:`PopulationArrays` holds a population's profiles as arrays for the vectorised forms.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedcure_app.devices.profiles import DeviceProfile


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

    def with_link_caps(self, cap_mbps: np.ndarray) -> "PopulationArrays":
        """This population with every client's up- and downlink rate capped at ``cap_mbps``
        (Mbit/s, one per client; ``inf`` = no cap): rate = min(device radio, access network)."""
        cap = np.asarray(cap_mbps, dtype=np.float64)
        if cap.shape != self.uplink_mbps.shape:
            raise ValueError(f"need one cap per client ({len(self)}), got shape {cap.shape}")
        if np.any(np.isnan(cap)) or np.any(cap <= 0):
            raise ValueError("link caps must be > 0 Mbit/s (inf for none)")
        return replace(self, uplink_mbps=np.minimum(self.uplink_mbps, cap),
                       downlink_mbps=np.minimum(self.downlink_mbps, cap))

    def energy_joules(self, samples: np.ndarray | int, f_ghz: np.ndarray | float,
                      idx: np.ndarray | None = None) -> np.ndarray:
        """Energy (J) of training ``samples`` samples at ``f_ghz`` on every device (or ``idx``)."""
        sel = slice(None) if idx is None else np.asarray(idx)
        f = np.asarray(f_ghz, dtype=np.float64)
        _check_positive("f_ghz", f)
        cycles = self.cycles_per_sample[sel] * np.asarray(samples, np.float64)
        return self.kappa[sel] * cycles * f * f


def access_caps(assignment: Sequence[int] | np.ndarray, caps_mbps: Sequence[float]) -> np.ndarray:
    """Each client's link cap (Mbit/s) from the access network of the ES it is assigned to.

    ``assignment``: client → ES (coalition) index; ES ``m`` has cap ``caps_mbps[m % len]``;
    an empty ``caps_mbps`` means no caps (``inf`` for every client).
    """
    a = np.asarray(assignment, dtype=np.int64)
    if not len(caps_mbps):
        return np.full(a.shape, np.inf)
    caps = np.asarray(caps_mbps, dtype=np.float64)
    _check_positive("caps_mbps", caps)
    if a.size and a.min() < 0:
        raise ValueError("ES indices must be >= 0")
    return caps[a % caps.size]
