"""Readings of the paper's setting: the one place that names what each changes and why.

The paper fixes the learning rate, τ_c, τ_e, ℓ, k, β and the rounds, but not its optimiser. A
*reading* is a set of configuration overrides on the paper's budget for what the paper leaves
open; ``fedcure experiment table1|clustering|efficiency|all --reading NAME`` runs under it and
writes ``<dataset>/<experiment>-<reading>/`` beside the literal reading's
``<dataset>/<experiment>/`` (the literal reading keeps the plain folder names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Reading:
    """One reading: its ``name`` (the CLI's), a short ``label``, the flat configuration
    overrides it applies (:func:`fedcure_app.config.apply_flat` keys) and ``why``: what the
    paper leaves open that it fills in."""

    name: str
    label: str
    flat: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""

    def folder(self, experiment: str) -> str:
        """The folder name of ``experiment`` under this reading."""
        return experiment if self.name == LITERAL else f"{experiment}-{self.name}"


LITERAL = "literal"

#: Every reading, the literal one (the default) first.
READINGS: Mapping[str, Reading] = MappingProxyType({
    LITERAL: Reading(
        LITERAL, "literal (plain SGD)", {},
        "the paper's setting as written: local training is plain mini-batch SGD at the "
        "paper's learning rate, no momentum, no weight decay"),
    "momentum": Reading(
        "momentum", "momentum 0.9", {"momentum": 0.9},
        "the paper names a learning rate but not its optimiser; SGD with momentum 0.9 is the "
        "usual choice for CNNs of this kind, and on MNIST it is the one change of the ablation "
        "that reaches the paper's accuracy (each client's momentum buffer starts at zero in "
        "every edge round)"),
})


def get_reading(name: str) -> Reading:
    """The reading ``name``; :class:`ValueError` naming the choices otherwise."""
    try:
        return READINGS[name]
    except KeyError:
        raise ValueError(f"unknown reading {name!r}; choose from {', '.join(READINGS)}") from None


def section_key(experiment: str, reading: str) -> str:
    """The key of an experiment's section under a reading (its folder name)."""
    return get_reading(reading).folder(experiment)


__all__ = ["LITERAL", "READINGS", "Reading", "get_reading", "section_key"]
