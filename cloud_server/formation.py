"""Forming the cloud's federation: client order, the initial client→ES association from home
ESs, no coalition left empty (:func:`partition`), and the strategy of the formed federation
(:func:`build_federation`). Pure: nothing here holds a lock or touches the network.

The rules themselves (``none``, ``kmeans``, ``meanshift``, ``fedcure``, ``selfish``,
``pareto``) are dispatched by :func:`fedcure_app.federation.form`, and the latency prior and the
strategy are built by :mod:`fedcure_app.federation`, shared with the simulation.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts
from fedcure_app.core.weight_cap import capped_by_coalition
from fedcure_app.devices import PopulationArrays
from fedcure_app.federation import build_strategy, coalitions_of, form, prior_latency
from cloud_server.state import ClientEntry, Federation

log = logging.getLogger("fedcure.cloud")


def natural_key(name: str) -> list[Any]:
    """Sort key putting ``c2`` before ``c10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def fill_empty_coalitions(assignment: np.ndarray, num_edges: int) -> tuple[np.ndarray, list[str]]:
    """Give every empty coalition one client from the largest one (needs N ≥ M).

    Returns the new assignment and a note per move. Deterministic: the moved client is the
    highest id of the largest coalition (lowest coalition index on ties).
    """
    a = np.asarray(assignment, dtype=np.int64).copy()
    notes: list[str] = []
    if a.size < num_edges:
        raise ValueError(f"{a.size} clients cannot fill {num_edges} coalitions")
    while True:
        sizes = np.bincount(a, minlength=num_edges)
        empty = np.flatnonzero(sizes == 0)
        if empty.size == 0:
            return a, notes
        big = int(np.argmax(sizes))
        moved = int(np.flatnonzero(a == big).max())
        a[moved] = int(empty[0])
        notes.append(f"client {moved} moved from coalition {big} to empty coalition {empty[0]}")


def initial_partition(homes: Sequence[int | None], num_edges: int) -> tuple[np.ndarray, list[str]]:
    """The initial client→ES association from the clients' home ESs.

    Clients without a home ES join the ES with the fewest clients so far (lowest index on ties);
    ESs nobody calls home get one client from the largest (see :func:`fill_empty_coalitions`).
    """
    a = np.full(len(homes), -1, dtype=np.int64)
    for i, h in enumerate(homes):
        if h is not None:
            a[i] = int(h)
    sizes = np.bincount(a[a >= 0], minlength=num_edges)
    for i in np.flatnonzero(a < 0):
        e = int(np.argmin(sizes))
        a[i] = e
        sizes[e] += 1
    return fill_empty_coalitions(a, num_edges)


def model_cycles_key(cfg: FedCureConfig) -> str:
    """What device profiles are asked the cycles per sample of: the dataset's name, or a
    task's model by its training FLOPs (:func:`fedcure_app.models.cycles_key`; builds the
    model once, so torch loads only for a task)."""
    if cfg.task is None:
        return cfg.data.dataset
    from fedcure_app.models import cycles_key

    return cycles_key(cfg.task)


def partition(cfg: FedCureConfig, clients: Sequence[ClientEntry]
              ) -> tuple[np.ndarray, np.ndarray, dict[str, Any], tuple[float, float]]:
    """Form the coalitions of ``clients`` (in id order) with the configured rule: the initial
    and the formed ES per client id, the rule's ``moves`` and ``stable``, and the average
    pairwise JSD Φ before and after (nats)."""
    m = cfg.federation.num_edges
    counts = np.stack([c.label_counts for c in clients])
    if cfg.task is not None:
        # the clients' own data: contiguous blocks in client order over the clients present
        # (a withdrawn client leaves no gap), as `fedcure simulate` lays out the same entries
        from fedcure_app.data.own_federation import initial_edges

        initial, notes = initial_edges(len(clients), m), []
    else:
        initial, notes = initial_partition([c.home_edge for c in clients], m)
    for note in notes:
        log.warning("initial partition: %s", note)
    t = time.perf_counter()
    assignment, result = form(cfg, counts, initial)
    assignment, notes = fill_empty_coalitions(assignment, m)
    for note in notes:
        log.warning("formation left a coalition empty: %s", note)
    coalitions = coalitions_of(assignment, m)
    jsd = (float(average_pairwise_jsd(coalition_label_counts(counts, initial, m))),
           float(average_pairwise_jsd(coalition_label_counts(counts, assignment, m))))
    log.info("coalition formation (%s) over %d clients in %.2f s: sizes %s, average JSD "
             "%.4f -> %.4f", cfg.method.formation, len(clients), time.perf_counter() - t,
             [len(c) for c in coalitions], jsd[0], jsd[1])
    formation = {"moves": getattr(result, "moves", None), "stable": getattr(result, "stable", None)}
    return initial, assignment, formation, jsd


def build_federation(cfg: FedCureConfig, clients: Sequence[ClientEntry], initial: np.ndarray,
                     assignment: np.ndarray, formation: dict[str, Any],
                     jsd: tuple[float, float] | None, arrays: list[np.ndarray]) -> Federation:
    """The formed federation of ``clients`` (in id order) with its strategy: the latency prior
    from the device profiles, the global model ``arrays`` (the caller gives the clients their
    ids)."""
    coalitions = coalitions_of(assignment, cfg.federation.num_edges)
    model_bytes = int(sum(a.nbytes for a in arrays))
    population = PopulationArrays.from_profiles([c.profile for c in clients],
                                                model_cycles_key(cfg))
    prior = prior_latency(population, coalitions, cfg.method.tau_c * cfg.method.batch_size,
                          model_bytes, cfg.method.tau_e, cfg.devices.edge_link_mbps,
                          cfg.devices.edge_round_overhead_s,
                          cfg.devices.edge_round_client_samples)
    # the counts the edges weight by: registered, capped at max-client-weight of the coalition
    samples = capped_by_coalition([c.samples for c in clients], coalitions,
                                  cfg.reliability.max_client_weight)
    strategy = build_strategy(cfg, coalitions, samples,
                              population, prior, arrays, deployed=True)
    return Federation(strategy, tuple(clients), initial, assignment, formation, population, jsd)


__all__ = ["build_federation", "fill_empty_coalitions", "initial_partition", "model_cycles_key",
           "natural_key",
           "partition"]
