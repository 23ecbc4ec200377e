"""CPU-frequency allocation rule (the paper's Theorem 2).

A client with c CPU cycles to run for one edge round (τ_c local steps), at frequency f GHz, with
the coalition's estimated per-edge-round latency T̂ seconds, has utility

    U(f) = α·(1 − c/(f·10⁹·T̂)) − γ·f^ς                                     (f in GHz).

U′(f) = α·c/(10⁹·T̂·f²) − γ·ς·f^(ς−1) has the sign of α·c/10⁹ − ς·γ·T̂·f^(ς+1), so U increases
then decreases and its maximiser on [f_min, f_max] is

    f* = clamp((α·(c/10⁹) / (ς·γ·T̂))^(1/(ς+1)), f_min, f_max).
"""

from __future__ import annotations

import numpy as np

from fedcure_app.core._checks import finite_array, finite_float


def _method_params(alpha, gamma, varsigma) -> tuple[float, float, float]:
    return (finite_float(alpha, "alpha", low=0.0, low_open=True),
            finite_float(gamma, "gamma", low=0.0, low_open=True),
            finite_float(varsigma, "varsigma", low=0.0, low_open=True))


def _out(x: np.ndarray, *inputs) -> float | np.ndarray:
    """A float when every input was a scalar, else the array."""
    if all(np.ndim(v) == 0 for v in inputs):
        return float(x)
    return x


def optimal_frequency(cycles, t_hat_s, *, alpha: float, gamma: float, varsigma: float,
                      f_min_ghz, f_max_ghz) -> float | np.ndarray:
    """f* (GHz) of Theorem 2 for CPU ``cycles`` (per edge round) and T̂ ``t_hat_s`` (seconds).

    All array arguments broadcast together (e.g. one entry per client); f_min ≤ f_max, both > 0.
    """
    a, g, s = _method_params(alpha, gamma, varsigma)
    c = finite_array(cycles, "cycles")
    t = finite_array(t_hat_s, "t_hat_s")
    lo = finite_array(f_min_ghz, "f_min_ghz")
    hi = finite_array(f_max_ghz, "f_max_ghz")
    if np.any(c < 0):
        raise ValueError("cycles must be non-negative")
    if np.any(t <= 0):
        raise ValueError("t_hat_s must be positive seconds")
    if np.any(lo <= 0):
        raise ValueError("f_min_ghz must be positive")
    if np.any(lo > hi):
        raise ValueError("f_min_ghz must not exceed f_max_ghz")
    try:
        raw = (a * (c / 1e9) / (s * g * t)) ** (1.0 / (s + 1.0))
        f = np.clip(raw, lo, hi)
    except ValueError as err:
        raise ValueError(f"inputs do not broadcast together: {err}") from None
    return _out(f, cycles, t_hat_s, f_min_ghz, f_max_ghz)


def frequency_utility(f_ghz, cycles, t_hat_s, *, alpha: float, gamma: float,
                      varsigma: float) -> float | np.ndarray:
    """U(f) = α(1 − c/(f·10⁹·T̂)) − γ·f^ς for f in GHz, c in cycles, T̂ in seconds."""
    a, g, s = _method_params(alpha, gamma, varsigma)
    f = finite_array(f_ghz, "f_ghz")
    c = finite_array(cycles, "cycles")
    t = finite_array(t_hat_s, "t_hat_s")
    if np.any(f <= 0):
        raise ValueError("f_ghz must be positive")
    if np.any(t <= 0):
        raise ValueError("t_hat_s must be positive seconds")
    if np.any(c < 0):
        raise ValueError("cycles must be non-negative")
    u = a * (1.0 - c / (f * 1e9 * t)) - g * f ** s
    return _out(u, f_ghz, cycles, t_hat_s)
