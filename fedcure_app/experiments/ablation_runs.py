"""The ablation's runs: the variants (one knob changed at a time against the literal reading),
the run of each, and the runs of Table 1's formed methods the report reads beside them.

:mod:`fedcure_app.experiments.ablation` is the experiment (its ``plan`` and ``analyse``);
:mod:`fedcure_app.experiments.ablation_dip` measures the dip of the formed methods' curves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedcure_app.experiments.base import Context, RunSpec
from fedcure_app.experiments.table1 import METHODS

#: The record fields the literal run must hold for the dip analysis.
DIAGNOSTICS: tuple[str, ...] = ("confusion", "edge_distance", "train_loss_first")
#: The formed methods whose curves show the dip (Table 1's runs, where cached).
FORMED: tuple[str, ...] = ("fedgreedy", "fedfair", "fedcure")


@dataclass(frozen=True)
class Variant:
    """One run of the ablation: ``flat`` configuration overrides on the literal run.

    ``reading``: the change is a reading of something the paper leaves open (its optimiser,
    batch size, what τ_c counts), so it may stand as a second reading of the paper's setting;
    otherwise it departs from a value the paper gives (lr 0.01, ℓ, τ_c = 5) and only measures
    the sensitivity."""

    key: str
    label: str
    flat: Mapping[str, Any] = field(default_factory=dict)
    reading: bool = True


#: Cheapest first; the literal run first of all (the dip analysis needs its diagnostics).
VARIANTS: tuple[Variant, ...] = (
    Variant("literal", "literal (τ_c = 5 steps, batch 32, lr 0.01, ℓ = 0.2, plain SGD)"),
    Variant("batch10", "batch size 10", {"batch-size": 10}),
    Variant("momentum", "momentum 0.9", {"momentum": 0.9}),
    Variant("lr", "lr 0.05", {"lr": 0.05}, reading=False),
    Variant("ell", "ℓ = 0.5", {"ell": 0.5}, reading=False),
    Variant("batch64", "batch size 64", {"batch-size": 64}),
    Variant("tau10", "τ_c = 10 steps", {"tau-c": 10}, reading=False),
    Variant("epoch", "τ_c = 1 local epoch (⌈|D_n|/B⌉ steps)", {"tau-c": 1, "tau-c-unit": "epochs"}),
)
VARIANT_BY_KEY: dict[str, Variant] = {v.key: v for v in VARIANTS}


def variant_spec(ctx: Context, v: Variant) -> RunSpec:
    """The run of variant ``v`` (FedCure, seed 0); the literal one is Table 1's FedCure run."""
    if v.key == "literal":
        return ctx.spec(f"{ctx.name} {METHODS['fedcure']}", "fedcure", seed=0,
                        needs=DIAGNOSTICS)
    return ctx.spec(f"{ctx.name} FedCure ablation: {v.label}", "fedcure", seed=0, **v.flat)


def plan(ctx: Context, only: Sequence[str] | None = None) -> list[RunSpec]:
    """The runs of the variants named in ``only`` (every variant when None), in
    :data:`VARIANTS` order."""
    return [variant_spec(ctx, v) for v in VARIANTS if only is None or v.key in only]


def parse_variants(value: str) -> list[str]:
    """Variant keys from a comma-separated ``value`` ('all': every one), checked."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError("no ablation variant given")
    if names == ["all"]:
        return [v.key for v in VARIANTS]
    bad = [n for n in names if n not in VARIANT_BY_KEY]
    if bad:
        raise ValueError(f"unknown ablation variant {bad[0]!r}; choose from "
                         f"{', '.join(VARIANT_BY_KEY)} or all")
    return list(dict.fromkeys(names))


def formed_specs(ctx: Context, method: str) -> list[RunSpec]:
    """Table 1's runs of ``method`` (every seed) at the literal reading."""
    return [ctx.spec(f"{ctx.name} {METHODS[method]}", method, seed=s) for s in ctx.seeds()]


def second_reading_specs(ctx: Context, v: Variant, method: str) -> list[RunSpec]:
    """Table 1's runs of ``method`` (every seed) at reading ``v``."""
    return [ctx.spec(f"{ctx.name} {METHODS[method]} ({v.label})", method, seed=s, **v.flat)
            for s in ctx.seeds()]


def regenerate_command(ctx: Context) -> str:
    """The command that rewrites this section from its cache (``DIR``: the data folder); it
    simulates nothing (``--cache-only``: variants not cached stay "not run yet")."""
    out = ctx.out_dir.parent
    return (f"fedcure experiment ablation --dataset {ctx.name} --budget {ctx.budget.name} "
            f"--out {out.as_posix()} --data-dir DIR --cache-only")
