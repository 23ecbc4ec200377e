"""When a simulated run evaluates and stops, how much a client trains per edge round, and what
a run's records add up to: shared by FedCure's engine and the peers' (``peer_engine``), so that
both are measured alike."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fedcure_app.config import FedCureConfig

#: Test samples per forward pass when the global model is evaluated on a GPU: the test split in
#: ten launches, with activations small enough (under 1 GiB for the CIFAR-10 CNN) that a dozen
#: job processes share one GPU (on the CPU, 256 keeps activations in cache).
GPU_EVAL_BATCH = 1000


def eval_batch_size(device: torch.device | str) -> int:
    """Evaluation batch for ``device``: :data:`GPU_EVAL_BATCH` on a GPU, else 256."""
    return GPU_EVAL_BATCH if torch.device(device).type != "cpu" else 256


class EvalSchedule:
    """When the global model is evaluated: every ``run.eval-every`` rounds, or with
    ``run.eval-every-s`` at the first round at or past each multiple of that many simulated
    seconds (the same cadence in time whatever a round lasts, for comparing methods)."""

    def __init__(self, cfg: FedCureConfig) -> None:
        self.rounds = cfg.run.eval_every
        self.every_s = cfg.run.eval_every_s
        self.next_s = self.every_s

    def due(self, round_: int, now_s: float) -> bool:
        """Whether round ``round_``, ending at ``now_s``, is evaluated (the last one is anyway)."""
        if self.every_s is None or self.next_s is None:
            return round_ % self.rounds == 0
        if now_s < self.next_s:
            return False
        self.next_s = (math.floor(now_s / self.every_s) + 1) * self.every_s
        return True


def local_steps(cfg: FedCureConfig, client_samples: np.ndarray) -> np.ndarray:
    """Mini-batch steps each client takes in one edge round: τ_c, or τ_c·⌈|D_n|/B⌉ when τ_c
    counts epochs."""
    n = np.asarray(client_samples, dtype=np.int64)
    m = cfg.method
    if m.tau_c_unit == "epochs":
        return m.tau_c * -(-n // m.batch_size)
    return np.full(n.shape, m.tau_c, dtype=np.int64)


def past_budget(cfg: FedCureConfig, now_s: float) -> bool:
    """Whether simulated time ``now_s`` has reached ``run.time-budget-s`` (never without one)."""
    budget = cfg.run.time_budget_s
    return budget is not None and now_s >= budget


def record_totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's rounds, simulated seconds, energy (J), client steps, bytes on the cloud's links
    and the coefficient of variation of its round latencies, from its records."""
    lat = np.array([r["latency_s"] for r in records])
    return {
        "rounds": len(records),
        "simulated_seconds": records[-1]["time_s"] if records else 0.0,
        "energy_j": float(sum(r["energy_j"] for r in records)),
        "client_steps": int(sum(r["client_steps"] for r in records)),
        "wan_bytes": int(sum(r["wan_bytes"] for r in records)),
        "latency_cov": float(lat.std() / lat.mean()) if lat.size and lat.mean() > 0 else 0.0,
    }


__all__ = ["GPU_EVAL_BATCH", "EvalSchedule", "eval_batch_size", "local_steps", "past_budget",
           "record_totals"]
