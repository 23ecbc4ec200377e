"""Bayesian estimate of each coalition's latency (seconds), the T̂_m of the scheduling rule.

Model, per coalition m: the log-latency y = ln T is Normal(μ_m, σ_m²) with the conjugate
Normal-Inverse-Gamma prior

    σ² ~ InvGamma(a₀, b₀),   μ | σ² ~ Normal(μ₀, σ²/κ₀).

Prior, from the device-profile prediction T₀_m (``prior_latency``), a coefficient of variation
``prior_cv`` and a weight of ``prior_strength`` pseudo-observations:
κ₀ = prior_strength, a₀ = 1 + κ₀/2, s₀² = ln(1 + cv²) (the log-variance of a lognormal with that
CV), b₀ = s₀²·(a₀ − 1) so that E[σ²] = s₀², and μ₀ = ln T₀ − ½s₀²(1 + 1/κ₀) so that the prior
predictive mean below equals T₀ exactly.

After n observations (mean ȳ, centred sum of squares S) the posterior is NIG(μₙ, κₙ, aₙ, bₙ)
with κₙ = κ₀ + n, μₙ = (κ₀μ₀ + nȳ)/κₙ, aₙ = a₀ + n/2, bₙ = b₀ + S/2 + κ₀n(ȳ − μ₀)²/(2κₙ), and
the posterior predictive of y is Student-t with 2aₙ degrees of freedom, location μₙ and scale
√(bₙ(κₙ + 1)/(aₙκₙ)). ``prob_within`` and ``quantile`` use that Student-t exactly.

The exact predictive mean of T = e^y is infinite under a Student-t (it has no moment generating
function), so :meth:`LatencyEstimator.mean` is the *plug-in* mean: the exact conditional mean
E[T | σ²] = exp(μₙ + ½σ²(1 + 1/κₙ)) evaluated at the posterior mean σ² = bₙ/(aₙ − 1).

Prior calibration (``calibrate=True``, empirical Bayes): the device-profile predictions may be
right about how coalitions compare and wrong about the host as a whole (in deployment they miss
process start-up, messaging and a shared CPU; a factor of 100 or more is common). With
calibration every coalition's prior is centred on s·T₀_m, where ln s is the mean of
ln T − ln T₀ over all latencies observed so far, whichever coalition they came from. Without it
one arrival 1000× slower than its prior leaves a huge posterior variance and a plug-in mean far
above every observation; with it the prior moves to the observed scale at the first arrival.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from fedcure_app.core._checks import finite_array, finite_float, positive_int


class LatencyEstimator:
    """Conjugate lognormal latency model per coalition, vectorised over the M coalitions."""

    def __init__(self, prior_latency, prior_strength: float = 1.0, prior_cv: float = 0.3,
                 *, calibrate: bool = False) -> None:
        prior = finite_array(prior_latency, "prior_latency", ndim=1)
        if prior.size == 0:
            raise ValueError("prior_latency needs at least one coalition")
        if np.any(prior <= 0):
            raise ValueError("prior_latency must be positive seconds")
        self.prior_latency = prior.copy()
        self.prior_strength = finite_float(prior_strength, "prior_strength", low=0.0,
                                           low_open=True)
        self.prior_cv = finite_float(prior_cv, "prior_cv", low=0.0, low_open=True)
        self.kappa0 = self.prior_strength
        self.a0 = 1.0 + 0.5 * self.kappa0
        s2 = math.log1p(self.prior_cv ** 2)
        self.b0 = s2 * (self.a0 - 1.0)
        self.mu0 = np.log(prior) - 0.5 * s2 * (1.0 + 1.0 / self.kappa0)
        m = prior.size
        self.calibrate = bool(calibrate)
        #: sum and count of ln T − ln T₀ over every observation (prior calibration)
        self.calib_sum = 0.0
        self.calib_n = 0
        self.count = np.zeros(m)
        self.log_mean = np.zeros(m)
        self.log_m2 = np.zeros(m)

    @property
    def num_coalitions(self) -> int:
        return int(self.prior_latency.size)

    def _check_m(self, m: Any) -> int:
        idx = positive_int(m, "coalition index", minimum=0)
        if idx >= self.num_coalitions:
            raise ValueError(f"coalition index {idx} out of range [0, {self.num_coalitions})")
        return idx

    # ------------------------------------------------------------------ learning
    def update(self, m: int, latency_s: float) -> None:
        """Record one observed latency (seconds, > 0) of coalition m (Welford update on ln T)."""
        m = self._check_m(m)
        t = finite_float(latency_s, "latency_s", low=0.0, low_open=True)
        y = math.log(t)
        self.calib_sum += y - math.log(self.prior_latency[m])
        self.calib_n += 1
        self.count[m] += 1.0
        delta = y - self.log_mean[m]
        self.log_mean[m] += delta / self.count[m]
        self.log_m2[m] += delta * (y - self.log_mean[m])

    # ------------------------------------------------------------------ posterior
    @property
    def scale(self) -> float:
        """s: the factor every prior is multiplied by (1 without calibration or data)."""
        if not self.calibrate or self.calib_n == 0:
            return 1.0
        return math.exp(self.calib_sum / self.calib_n)

    def prior_location(self) -> np.ndarray:
        """μ₀ per coalition, shifted by ln s under calibration, shape (M,)."""
        return self.mu0 + math.log(self.scale)

    def posterior(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """NIG posterior parameters (μₙ, κₙ, aₙ, bₙ), each shape (M,)."""
        n = self.count
        mu0 = self.prior_location()
        kn = self.kappa0 + n
        mun = (self.kappa0 * mu0 + n * self.log_mean) / kn
        an = self.a0 + 0.5 * n
        bn = (self.b0 + 0.5 * self.log_m2
              + self.kappa0 * n * (self.log_mean - mu0) ** 2 / (2.0 * kn))
        return mun, kn, an, bn

    def predictive(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Student-t posterior predictive of ln T: (degrees of freedom, location, scale), (M,)."""
        mun, kn, an, bn = self.posterior()
        return 2.0 * an, mun, np.sqrt(bn * (kn + 1.0) / (an * kn))

    def mean(self) -> np.ndarray:
        """T̂: plug-in posterior predictive mean latency of every coalition (seconds), (M,)."""
        mun, kn, an, bn = self.posterior()
        return np.exp(mun + 0.5 * (bn / (an - 1.0)) * (1.0 + 1.0 / kn))

    def prob_within(self, m: int, deadline_s: float) -> float:
        """P(latency of coalition m ≤ deadline_s) under the Student-t predictive of ln T."""
        m = self._check_m(m)
        d = finite_float(deadline_s, "deadline_s")
        if d <= 0:
            return 0.0
        df, loc, scale = self.predictive()
        return float(stats.t.cdf((math.log(d) - loc[m]) / scale[m], df[m]))

    def quantile(self, m: int, q: float) -> float:
        """The q-quantile (0 < q < 1) of coalition m's predictive latency (seconds)."""
        m = self._check_m(m)
        q = finite_float(q, "q", low=0.0, high=1.0, low_open=True, high_open=True)
        df, loc, scale = self.predictive()
        return float(math.exp(loc[m] + scale[m] * stats.t.ppf(q, df[m])))

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state (prior and sufficient statistics)."""
        return {
            "prior_latency": self.prior_latency.tolist(),
            "prior_strength": self.prior_strength,
            "prior_cv": self.prior_cv,
            "calibrate": self.calibrate,
            "calib_sum": self.calib_sum,
            "calib_n": self.calib_n,
            "count": self.count.tolist(),
            "log_mean": self.log_mean.tolist(),
            "log_m2": self.log_m2.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (replaces prior and statistics)."""
        try:
            fresh = LatencyEstimator(state["prior_latency"], state["prior_strength"],
                                     state["prior_cv"],
                                     calibrate=bool(state.get("calibrate", False)))
            calib_sum = finite_float(state.get("calib_sum", 0.0), "calib_sum")
            calib_n = positive_int(state.get("calib_n", 0), "calib_n", minimum=0)
            stats_ = {k: finite_array(state[k], k, ndim=1)
                      for k in ("count", "log_mean", "log_m2")}
        except KeyError as err:
            raise ValueError(f"estimator state lacks {err.args[0]!r}") from None
        m = fresh.num_coalitions
        for k, v in stats_.items():
            if v.shape != (m,):
                raise ValueError(f"estimator state {k!r} must have {m} entries, got {v.size}")
        if np.any(stats_["count"] < 0) or np.any(stats_["log_m2"] < 0):
            raise ValueError("estimator state has negative counts or sums of squares")
        self.__dict__.update(fresh.__dict__)
        self.calib_sum, self.calib_n = calib_sum, calib_n
        self.count = stats_["count"].copy()
        self.log_mean = stats_["log_mean"].copy()
        self.log_m2 = stats_["log_m2"].copy()
