"""The metrics of an ``evaluate`` reply (federated evaluation), the same keys from every client.

The ClientApp answers an evaluate message with one ``MetricRecord`` holding ``num-examples``,
``loss`` and ``accuracy`` (the evaluated part's size, mean cross-entropy and accuracy) and the
sums the cloud adds up over clients (:class:`fedcure_app.tasks.EvalSums`):

- ``eval-samples``: held-out samples evaluated (0: the client has no held-out part);
- ``eval-loss-sum``: their summed cross-entropy (nats);
- ``eval-correct``: correct predictions;
- ``eval-class-correct`` / ``eval-class-total``: per class of the task (class order), correct
  predictions and samples (lists of ints, one entry per class).

Every key is always present (Flower refuses metric records whose keys differ between the
replies it aggregates), and the per-class lists have the task's length on every client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedcure_app.tasks import EvalSums

SAMPLES = "eval-samples"
LOSS_SUM = "eval-loss-sum"
CORRECT = "eval-correct"
CLASS_CORRECT = "eval-class-correct"
CLASS_TOTAL = "eval-class-total"
#: the sums' keys of an evaluate reply's MetricRecord
SUM_KEYS = (SAMPLES, LOSS_SUM, CORRECT, CLASS_CORRECT, CLASS_TOTAL)


def sums_to_metrics(sums: EvalSums) -> dict[str, Any]:
    """``sums`` as MetricRecord entries (:data:`SUM_KEYS`)."""
    return {SAMPLES: int(sums.samples), LOSS_SUM: float(sums.loss_sum),
            CORRECT: int(sums.correct),
            CLASS_CORRECT: [int(v) for v in sums.class_correct],
            CLASS_TOTAL: [int(v) for v in sums.class_total]}


def sums_from_metrics(metrics: Mapping[str, Any]) -> EvalSums:
    """The :class:`EvalSums` of an evaluate reply's metrics; ``ValueError`` naming what is
    missing or inconsistent."""
    missing = [k for k in SUM_KEYS if k not in metrics]
    if missing:
        raise ValueError(f"metrics lack {', '.join(missing)}")
    try:
        return EvalSums(
            samples=int(metrics[SAMPLES]), loss_sum=float(metrics[LOSS_SUM]),
            correct=int(metrics[CORRECT]),
            class_correct=tuple(int(v) for v in metrics[CLASS_CORRECT]),
            class_total=tuple(int(v) for v in metrics[CLASS_TOTAL]))
    except TypeError as err:
        raise ValueError(f"malformed evaluation metrics: {err}") from None


__all__ = ["CLASS_CORRECT", "CLASS_TOTAL", "CORRECT", "LOSS_SUM", "SAMPLES", "SUM_KEYS",
           "sums_from_metrics", "sums_to_metrics"]
