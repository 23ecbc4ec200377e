"""What the cloud asks of an edge, and what the edge answers: transport-free value types.

An :class:`EdgeTask` is one global task for one coalition: τ_e synchronous FedAvg rounds of τ_c
local steps each, starting from global model version ``version``, with each client's
CPU-frequency directive. The simulation's executors, the Flower edge loop (``edge.py``) and the
deployed edge role all take an ``EdgeTask`` and give back an :class:`EdgeResult`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ClientReport:
    """One client's part in one edge round.

    ``seconds``: measured wall time of local training (after any emulated throttle);
    ``f_applied_ghz``: the CPU frequency the client really ran at.
    """

    client: int
    edge_round: int
    samples: int
    seconds: float
    f_applied_ghz: float
    loss: float


@dataclass(frozen=True)
class EdgeTask:
    """One coalition's global task (see module docstring).

    ``tau_c_unit``: ``steps`` (τ_c mini-batches per client and edge round) or ``epochs`` (τ_c
    passes over each client's data); ``momentum``: SGD momentum of local training. Both are
    simulation knobs: the deployed task message carries neither (their defaults there).
    """

    task_id: str
    coalition: int
    version: int
    arrays: list[np.ndarray]
    clients: tuple[int, ...]
    frequencies_ghz: dict[int, float]
    tau_e: int
    tau_c: int
    lr: float
    batch_size: int
    seed: int
    momentum: float = 0.0
    tau_c_unit: str = "steps"
    #: an evaluation task (federated evaluation): every client evaluates ``arrays`` (global
    #: version ``version``) on its held-out part; nothing is trained
    evaluate: bool = False
    #: client id -> the sample count it registered: the edge's FedAvg weights (empty: each
    #: reply's ``num-examples``, as the simulation's clients report their true counts)
    client_samples: dict[int, int] = field(default_factory=dict)
    #: the largest FedAvg weight one client may take (:func:`fedcure_app.core.weight_cap.
    #: cap_weights`; 0 or 1: none)
    max_client_weight: float = 0.0
    #: the farthest (L2) one client's reply may lie from the model it was sent in an edge
    #: round, lr·τ_c·G (0: not screened)
    client_step_bound: float = 0.0

    def local_amount(self) -> dict[str, int]:
        """How much each client trains per edge round, as :func:`fedcure_app.training.
        train_local`'s keyword: ``{"steps": τ_c}`` or ``{"epochs": τ_c}``."""
        if self.tau_c_unit == "epochs":
            return {"epochs": self.tau_c}
        if self.tau_c_unit != "steps":
            raise ValueError(f"tau_c_unit must be steps or epochs, got {self.tau_c_unit!r}")
        return {"steps": self.tau_c}

    @property
    def simulation_only(self) -> list[str]:
        """The knobs of this task set away from what a deployed client can run (hyphenated
        configuration keys); empty when a Flower ClientApp can train it."""
        out = []
        if self.momentum != 0.0:
            out.append("momentum")
        if self.tau_c_unit != "steps":
            out.append("tau-c-unit")
        return out


@dataclass
class EdgeResult:
    """The edge model after τ_e rounds, its FedAvg weight and what each client reported.

    ``startup_s``: seconds of the task that were start-up rather than training (deployment:
    client start-up inside edge rounds, Σ over rounds of the slowest client's; the edge adds its
    wait for the coalition's clients to come online). 0 in simulation.
    """

    task_id: str
    coalition: int
    arrays: list[np.ndarray]
    num_samples: int
    reports: list[ClientReport] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    startup_s: float = 0.0


@dataclass(frozen=True)
class EvalSums:
    """One client's evaluation of a model on its held-out part, as sums (so that sums over
    clients give the sample-weighted accuracy and loss exactly).

    ``samples`` evaluated; ``loss_sum``: the summed cross-entropy (nats); ``correct``
    predictions; ``class_correct``/``class_total``: per class of the task (class order), the
    correct predictions and the samples. All zero for a client without a held-out part.
    """

    samples: int
    loss_sum: float
    correct: int
    class_correct: tuple[int, ...]
    class_total: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.class_correct) != len(self.class_total):
            raise ValueError(f"{len(self.class_correct)} per-class correct counts for "
                             f"{len(self.class_total)} per-class totals")
        if not (0 <= self.correct <= self.samples and sum(self.class_total) == self.samples
                and all(0 <= c <= t for c, t in zip(self.class_correct, self.class_total))
                and sum(self.class_correct) == self.correct):
            raise ValueError("evaluation sums are inconsistent: need 0 <= correct <= samples, "
                             "per-class totals summing to samples and per-class correct "
                             "counts (each <= its total) summing to correct")
        if not (self.loss_sum >= 0 and np.isfinite(self.loss_sum)):
            raise ValueError(f"loss_sum must be finite and >= 0, got {self.loss_sum}")

    @classmethod
    def empty(cls, num_classes: int) -> "EvalSums":
        """Nothing evaluated (a client without a held-out part)."""
        return cls(0, 0.0, 0, (0,) * num_classes, (0,) * num_classes)


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed derived deterministically from the given parts (run seed, round, client…)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


def client_train_seed(task_seed: int, edge_round: int, client: int) -> int:
    """The seed of one client's local training in one edge round of a task."""
    return derive_seed(task_seed, edge_round, client)


def fedavg_weights(samples: list[int]) -> np.ndarray:
    """FedAvg weights (sample counts normalised), validated."""
    w = np.asarray(samples, dtype=np.float64)
    if w.size == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"FedAvg needs positive sample counts, got {samples}")
    return w / w.sum()
