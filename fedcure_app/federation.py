"""Building a federation's pieces, shared by the simulation and the deployed cloud.

One place for what both ``fedcure_app.simulation.engine`` and ``cloud_server`` must do the
same way, so the two cannot drift: the formation dispatch (which rule forms the coalitions),
the device-profile latency prior of each coalition, and the :class:`FedCureStrategy` built
from them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.core.coalition import FormationResult, cluster_coalitions, form_coalitions
from fedcure_app.devices import PopulationArrays
from fedcure_app.strategy import FedCureStrategy


def form(cfg: FedCureConfig, counts: np.ndarray, initial: np.ndarray
         ) -> tuple[np.ndarray, FormationResult | None]:
    """Coalition assignment (client → coalition) for the configured rule ``method.formation``.

    ``none`` keeps ``initial``; ``kmeans``/``meanshift`` cluster the label histograms
    ``counts`` (clients × classes); ``fedcure``/``selfish``/``pareto`` run the coalition game
    from ``initial`` and also return its :class:`FormationResult` (moves, stability).
    """
    rule = cfg.method.formation
    m = cfg.federation.num_edges
    if rule == "none":
        return np.asarray(initial).copy(), None
    if rule in ("kmeans", "meanshift"):
        return np.asarray(cluster_coalitions(counts, m, method=rule, seed=cfg.run.seed)), None
    res = form_coalitions(counts, initial, m, rule=rule, seed=cfg.run.seed)
    return np.asarray(res.assignment), res


def coalitions_of(assignment: np.ndarray, num_edges: int) -> list[list[int]]:
    """Client ids of each coalition, in id order."""
    a = np.asarray(assignment)
    return [np.flatnonzero(a == e).tolist() for e in range(num_edges)]


def prior_latency(population: PopulationArrays, coalitions: Sequence[Sequence[int]],
                  samples_per_round: int, model_bytes: int, tau_e: int,
                  edge_link_mbps: float) -> np.ndarray:
    """Device-profile prediction of each coalition's task latency at f_max, no jitter (s).

    τ_e edge rounds, each as slow as the coalition's slowest client (compute c_n/f_n and the
    client↔edge model transfers), plus the model down and up the edge↔cloud link
    (2 · 8 · bytes / (Mbit/s · 10⁶) seconds).
    """
    per_client = population.round_seconds(samples_per_round, model_bytes, population.f_max_ghz)
    link = 2 * 8.0 * model_bytes / (edge_link_mbps * 1e6)
    return np.array([tau_e * per_client[list(c)].max() + link for c in coalitions])


def build_strategy(cfg: FedCureConfig, coalitions: list[list[int]], client_samples: np.ndarray,
                   population: PopulationArrays, prior_latency_s: np.ndarray,
                   initial_arrays: list[np.ndarray], *, deployed: bool) -> FedCureStrategy:
    """The :class:`FedCureStrategy` of a formed federation.

    ``client_samples``: |D_n| per client; cycles per edge round from the profiles at
    τ_c · batch size samples; frequency bounds [f_min, f_max] GHz; ``deployed`` chooses whether
    the estimator calibrates its prior (``devices.calibrates``).
    """
    spr = cfg.method.tau_c * cfg.method.batch_size
    return FedCureStrategy(
        cfg.method,
        coalitions,
        client_samples,
        population.cycles(spr),
        np.stack([population.f_min_ghz, population.f_max_ghz], axis=1),
        prior_latency_s,
        initial_arrays,
        max_concurrent=cfg.concurrency,
        seed=cfg.run.seed,
        calibrate_prior=cfg.devices.calibrates(deployed=deployed),
    )


__all__ = ["build_strategy", "coalitions_of", "form", "prior_latency"]
