"""Per-class results by class name (pure, no torch): what ``result.json``'s
``class_accuracy_by_name``, the end-of-run tables, the live view and the clients' logs show."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def run_classes(cfg: Any) -> tuple[str, ...]:
    """The class names of a run in label order: its task's, or its built-in dataset's."""
    if cfg.task is not None:
        return tuple(cfg.task.classes)
    from fedcure_app.data.specs import SPECS

    return tuple(SPECS[cfg.data.dataset].class_names)


def by_name(values: Sequence[float | None] | None,
            classes: Sequence[str]) -> dict[str, float | None] | None:
    """``values[k]`` keyed by ``classes[k]`` (a NaN, a class without samples, becomes None);
    None when there are no values or they do not cover the classes."""
    if not values or len(values) != len(classes):
        return None
    return {name: (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
            for name, v in zip(classes, values)}


def last_class_accuracy(records: Sequence[Mapping[str, Any]]) -> list[float | None] | None:
    """The per-class accuracy of the last evaluated record (None: no record has one)."""
    for rec in reversed(records):
        got = rec.get("class_accuracy")
        if got:
            return list(got)
    return None


def extremes(accuracy: Mapping[str, float | None], k: int = 3
             ) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The ``k`` weakest (lowest accuracy first) and ``k`` strongest (highest first) classes
    that have an accuracy (equal accuracies: the weakest in class order). With fewer than 2·k
    classes the two lists split them (no class is in both)."""
    ranked = sorted(((name, float(v)) for name, v in accuracy.items() if v is not None),
                    key=lambda kv: kv[1])
    if len(ranked) < 2:
        return ranked, []
    k = max(0, min(k, len(ranked) // 2))
    return ranked[:k], ranked[::-1][:k]


def class_line(pairs: Sequence[tuple[str, float]]) -> str:
    """``bag 41.0 %, coat 55.5 %``."""
    return ", ".join(f"{name} {100 * v:.1f} %" for name, v in pairs) or "-"


def class_rows(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The end-of-run table's rows naming the weakest and strongest classes of a result
    (``class_accuracy_by_name``; none without a per-class evaluation)."""
    by = result.get("class_accuracy_by_name")
    if not by:
        return []
    weak, strong = extremes(by)
    rows = [("weakest classes", class_line(weak))]
    return rows + ([("strongest classes", class_line(strong))] if strong else [])


def holding_text(cfg: Any, samples: int) -> str:
    """``task, 270 samples`` (own data), or ``mnist, 270 samples`` (a built-in dataset)."""
    return f"{'task' if cfg.task is not None else cfg.data.dataset}, {samples} samples"


def counts_text(counts: Sequence[int], classes: Sequence[str] | None) -> str:
    """Label counts by class name, ``{bag: 90, coat: 90}``, leaving out classes of 0 samples
    (all of them when every count is 0); by index (``[0, 90, …]``) without names."""
    if not classes or len(classes) != len(counts):
        return str(list(counts))
    held = [(c, int(n)) for c, n in zip(classes, counts) if n] or list(zip(classes, counts))
    return "{" + ", ".join(f"{c}: {int(n)}" for c, n in held) + "}"


__all__ = ["by_name", "class_line", "class_rows", "counts_text", "extremes", "holding_text",
           "last_class_accuracy", "run_classes"]
