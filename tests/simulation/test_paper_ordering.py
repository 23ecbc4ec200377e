"""The paper's ordering on the offline digits data (edge non-IID, 50 clients, 5 ESs).

Without formation every coalition holds 2 of the 10 classes, so Greedy and Fair keep pulling the
global model towards 2-class edge models; FedCure's formation makes every coalition cover all
classes, so FedGreedy, FedFair and FedCure learn the whole task. A short run (40 global rounds,
τ_e = 2) already separates the two groups by tens of points; we compare the mean of the last three
evaluations to keep one noisy evaluation from deciding.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.simulation.engine import simulate


@pytest.fixture(scope="module")
def late_accuracy() -> dict[str, float]:
    ds = load_dataset("digits")
    out = {}
    for method in ("greedy", "fair", "fedgreedy", "fedfair", "fedcure"):
        cfg = apply_flat(FedCureConfig(), {
            "method": method, "global-rounds": 40, "tau-e": 2, "tau-c": 5,
            "eval-every": 5, "seed": 0, "lr": 0.05,
        })
        res = simulate(cfg, dataset=ds)
        accs = [r["accuracy"] for r in res["records"] if r["accuracy"] is not None]
        out[method] = float(np.mean(accs[-3:]))
    return out


def test_fedcure_clearly_beats_greedy_on_edge_noniid_digits(late_accuracy):
    assert late_accuracy["fedcure"] > late_accuracy["greedy"] + 0.2, late_accuracy


def test_every_formation_method_beats_both_plain_schedulers(late_accuracy):
    formed = min(late_accuracy[m] for m in ("fedgreedy", "fedfair", "fedcure"))
    plain = max(late_accuracy[m] for m in ("greedy", "fair"))
    assert formed > plain + 0.1, late_accuracy
