"""How much compute an experiment may spend: the ``tiny``, ``quick`` and ``paper`` budgets.

A budget fixes the training knobs (global rounds, τ_c, τ_e, learning rate, seeds, how much of the
test split is evaluated) per dataset; everything else keeps the configuration defaults, which are
the paper's (50 clients, 5 ESs, edge non-IID, ℓ = 0.2, k = 0.95, β = 0.5). ``paper`` is the paper's
setting; ``quick`` cuts rounds, τ_e and seeds so that ``fedcure experiment all`` fits in minutes on
a 2-core CPU and raises the learning rate to make up for the shorter run; ``tiny`` is for tests.

Schedule-only runs (the efficiency experiment) do no training, so they always use the paper's
τ_e and many rounds: their latencies and queues do not depend on the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fedcure_app.config import FedCureConfig, apply_flat

BUDGETS: tuple[str, ...] = ("tiny", "quick", "paper")

#: Datasets whose models are cheap enough to train for longer at the quick budget.
_SMALL = ("digits",)


@dataclass(frozen=True)
class Budget:
    """The knobs a budget sets for one dataset (rounds are global rounds = edge-model arrivals)."""

    name: str
    rounds: int
    tau_c: int
    tau_e: int
    lr: float
    eval_every: int
    #: Seeds for Table 1 (mean ± std, Cohen's d).
    seeds: int
    #: Seeds for the clustering and RH experiments (a prefix of Table 1's seeds).
    side_seeds: int
    #: Test samples evaluated (a fixed seeded subset); None = the whole test split.
    eval_samples: int | None
    #: Clients and ESs of the main federation (the paper: 50 and 5).
    clients: int = 50
    edges: int = 5
    #: Global rounds of the schedule-only efficiency runs, and the β values compared there.
    schedule_rounds: int = 200
    betas: tuple[float, ...] = (0.0, 0.5, 2.0, 10.0, 100.0)
    #: κ values of FedCure's schedule-only κ sweep (δ_m = κ·|D_m|/|D|), every Table 1 seed.
    kappas: tuple[float, ...] = (1.0, 0.9, 0.75, 0.5, 0.25)

    def overrides(self) -> dict[str, Any]:
        """Flat configuration overrides (see :func:`fedcure_app.config.apply_flat`)."""
        return {
            "num-clients": self.clients, "num-edges": self.edges,
            "global-rounds": self.rounds, "tau-c": self.tau_c, "tau-e": self.tau_e,
            "lr": self.lr, "eval-every": self.eval_every,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(self.betas)
        d["kappas"] = list(self.kappas)
        return d


def get_budget(name: str, dataset: str, seeds: int | None = None,
               side_seeds: int | None = None) -> Budget:
    """The budget ``name`` for ``dataset``; ``seeds`` (if given) overrides the Table 1 seeds,
    ``side_seeds`` those of the clustering and RH experiments (at most ``seeds``)."""
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; choose one of {', '.join(BUDGETS)}")
    small = dataset in _SMALL
    if name == "tiny":
        b = Budget("tiny", rounds=4, tau_c=1, tau_e=1, lr=0.05, eval_every=2, seeds=2,
                   side_seeds=1, eval_samples=200, clients=12, edges=3,
                   schedule_rounds=30, betas=(0.0, 2.0), kappas=(1.0, 0.5))
    elif name == "quick":
        if small:
            b = Budget("quick", rounds=50, tau_c=5, tau_e=2, lr=0.05, eval_every=5, seeds=3,
                       side_seeds=1, eval_samples=None)
        else:
            b = Budget("quick", rounds=16, tau_c=5, tau_e=1, lr=0.05, eval_every=4, seeds=2,
                       side_seeds=1, eval_samples=1000)
    else:
        lr = 0.005 if dataset == "svhn" else 0.01
        rounds = 100 if dataset in ("digits", "mnist") else 200
        b = Budget("paper", rounds=rounds, tau_c=5, tau_e=12, lr=lr, eval_every=5, seeds=5,
                   side_seeds=5, eval_samples=None, schedule_rounds=max(200, rounds))
    if seeds is not None:
        if seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {seeds}")
        b = Budget(**{**asdict(b), "seeds": seeds, "side_seeds": min(b.side_seeds, seeds)})
    if side_seeds is not None:
        if not 1 <= side_seeds <= b.seeds:
            raise ValueError(f"--side-seeds must be between 1 and the Table 1 seeds ({b.seeds}), "
                             f"got {side_seeds}")
        b = Budget(**{**asdict(b), "side_seeds": side_seeds})
    return b


def base_config(dataset: str, data_dir: str | None, budget: Budget) -> FedCureConfig:
    """The configuration every run of an experiment starts from (seed 0, FedCure method)."""
    flat: dict[str, Any] = {"dataset": dataset, "seed": 0, **budget.overrides()}
    if data_dir:
        flat["data-dir"] = data_dir
    return apply_flat(FedCureConfig(), flat)


__all__ = ["BUDGETS", "Budget", "base_config", "get_budget"]
