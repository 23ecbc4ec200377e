"""Building a federation's pieces, shared by the simulation and the deployed cloud.

One place for what both ``fedcure_app.simulation.engine`` and ``cloud_server`` must do the
same way, so the two cannot drift: the formation dispatch (which rule forms the coalitions),
the device-profile latency prior of each coalition, and the :class:`FedCureStrategy` built
from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedcure_app.config import ConfigError, FedCureConfig

if TYPE_CHECKING:  # imported where used: a client needs only partition_for and profiles_for,
    # and the coalition game and the strategy pull in scipy (tens of MB in every client role)
    from fedcure_app.core.coalition import FormationResult
    from fedcure_app.devices import PopulationArrays
    from fedcure_app.strategy import FedCureStrategy


def form(cfg: FedCureConfig, counts: np.ndarray, initial: np.ndarray
         ) -> tuple[np.ndarray, FormationResult | None]:
    """Coalition assignment (client → coalition) for the configured rule ``method.formation``.

    ``none`` keeps ``initial``; ``kmeans``/``meanshift`` cluster the label histograms
    ``counts`` (clients × classes); ``fedcure``/``selfish``/``pareto`` run the coalition game
    from ``initial`` and also return its :class:`FormationResult` (moves, stability).
    """
    from fedcure_app.core.coalition import cluster_coalitions, form_coalitions

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


def samples_per_round(cfg: FedCureConfig, client_samples: np.ndarray) -> np.ndarray:
    """Samples each client trains on in one edge round, the work its c_n counts (docs/DESIGN.md,
    "Latency model"): τ_c · batch size when τ_c counts mini-batch steps (the same for every
    client), τ_c · |D_n| when it counts local epochs (every sample once per epoch, the last
    mini-batch possibly short). ``client_samples``: |D_n| per client."""
    n = np.asarray(client_samples, dtype=np.int64)
    m = cfg.method
    if m.tau_c_unit == "epochs":
        return m.tau_c * n
    return np.full(n.shape, m.tau_c * m.batch_size, dtype=np.int64)


def prior_latency(population: PopulationArrays, coalitions: Sequence[Sequence[int]],
                  samples_per_round: int | np.ndarray, model_bytes: int, tau_e: int,
                  edge_link_mbps: float, edge_round_overhead_s: float = 0.0,
                  edge_round_client_samples: int = 0) -> np.ndarray:
    """Device-profile prediction of each coalition's task latency at f_max, no jitter (s).

    ``samples_per_round``: one count for every client or one per client
    (:func:`samples_per_round`).

    τ_e edge rounds, each as slow as the coalition's slowest client (compute c_n/f_n and the
    client↔edge model transfers), plus the model down and up the edge↔cloud link
    (2 · 8 · bytes / (Mbit/s · 10⁶) seconds); ``edge_round_overhead_s``: the deployment's
    messaging added to each edge round (``devices.edge_round_overhead_s``, s);
    ``edge_round_client_samples``: a client's work per edge round beyond training, in samples
    (``devices.edge_round_client_samples``), computed at its device's speed.
    """
    samples = np.asarray(samples_per_round) + edge_round_client_samples
    per_client = population.round_seconds(samples, model_bytes, population.f_max_ghz)
    link = 2 * 8.0 * model_bytes / (edge_link_mbps * 1e6)
    return np.array([tau_e * (per_client[list(c)].max() + edge_round_overhead_s) + link
                     for c in coalitions])


def simulation_only_knobs(cfg: FedCureConfig) -> list[str]:
    """The configuration keys set away from their defaults that only the in-process simulation
    honours (a Flower ClientApp or a deployed client trains τ_c plain-SGD steps): ``momentum``,
    ``tau-c-unit``."""
    out = []
    if cfg.method.momentum != 0.0:
        out.append("momentum")
    if cfg.method.tau_c_unit != "steps":
        out.append("tau-c-unit")
    return out


def partition_for(cfg: FedCureConfig, dataset: Any) -> Any:
    """The client partition of ``cfg`` over ``dataset`` (one builder for the engine, the Flower apps and the roles)."""
    from fedcure_app.data.partition import partition_dataset

    fed = cfg.federation
    if getattr(dataset, "client_indices", None) is not None:
        from fedcure_app.data.own_federation import given_partition

        return given_partition(dataset, fed.num_edges, cfg.run.seed)
    return partition_dataset(
        dataset.y_train, fed.num_clients, fed.num_edges, cfg.data.partition,
        seed=cfg.run.seed, alpha=cfg.data.dirichlet_alpha,
        shards_per_client=cfg.data.shards_per_client,
        classes_per_edge=cfg.data.classes_per_edge, num_classes=dataset.num_classes,
    )


def profiles_for(cfg: FedCureConfig) -> list:
    """The simulated device profile of every client (one builder for the engine, the Flower apps and the roles)."""
    from fedcure_app.devices import load_profiles, sample_population

    n = cfg.federation.num_clients
    if cfg.devices.profiles_file:
        profiles = load_profiles(cfg.devices.profiles_file)
        if len(profiles) < n:
            rng = np.random.default_rng(cfg.run.seed)
            profiles = [profiles[i] for i in rng.integers(0, len(profiles), n)]
    else:
        profiles = sample_population(n, seed=cfg.run.seed, mix=cfg.devices.mix)
    return list(profiles[:n])


def build_strategy(cfg: FedCureConfig, coalitions: list[list[int]], client_samples: np.ndarray,
                   population: PopulationArrays, prior_latency_s: np.ndarray,
                   initial_arrays: list[np.ndarray], *, deployed: bool) -> FedCureStrategy:
    """The :class:`FedCureStrategy` of a formed federation.

    ``client_samples``: |D_n| per client; cycles per edge round from the profiles at
    :func:`samples_per_round` samples; frequency bounds [f_min, f_max] GHz; ``deployed`` chooses
    whether the estimator calibrates its prior (``devices.calibrates``) and leaves each
    coalition's first task out (``devices.warmups``), and refuses the
    simulation-only knobs (:func:`simulation_only_knobs`).
    """
    if deployed and simulation_only_knobs(cfg):
        raise ConfigError(
            f"{', '.join(simulation_only_knobs(cfg))}: simulation only (a deployed task carries "
            "τ_c mini-batch steps, lr and batch size; plain SGD); leave at the default")
    from fedcure_app.strategy import FedCureStrategy

    return FedCureStrategy(
        cfg.method,
        coalitions,
        client_samples,
        population.cycles(samples_per_round(cfg, client_samples)),
        np.stack([population.f_min_ghz, population.f_max_ghz], axis=1),
        prior_latency_s,
        initial_arrays,
        max_concurrent=cfg.concurrency,
        seed=cfg.run.seed,
        calibrate_prior=cfg.devices.calibrates(deployed=deployed),
        warmup_tasks=cfg.devices.warmups(deployed=deployed),
    )


__all__ = ["build_strategy", "coalitions_of", "form", "partition_for", "prior_latency",
           "profiles_for", "samples_per_round",
           "simulation_only_knobs"]
