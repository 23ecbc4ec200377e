"""What every experiment module shares: the per-dataset context and the section it returns.

An experiment module exposes ``NAME``, ``TITLE``, ``plan(ctx) -> list[RunSpec]`` (the simulations
it needs, so a driver can run all of them under one progress bar) and ``analyse(ctx) -> Section``
(tables, figures and numbers; it asks ``ctx.runner`` for results, which are memoised).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.data import Dataset
from fedcure_app.experiments.budget import Budget, base_config
from fedcure_app.experiments.readings import READINGS, LITERAL, Reading
from fedcure_app.experiments.runner import Runner, RunSpec


@dataclass
class Context:
    """One dataset's experiment context: data, budget, output folder and the shared runner."""

    dataset: Dataset
    data_dir: str | None
    budget: Budget
    out_dir: Path
    runner: Runner
    #: the reading of the paper's setting the runs use (:mod:`.readings`)
    reading: Reading = READINGS[LITERAL]
    #: flat overrides every run takes besides the reading's (e.g. the executor)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.dataset.name

    def base(self) -> FedCureConfig:
        """The budget's configuration for this dataset under the reading (seed 0, FedCure)."""
        cfg = base_config(self.dataset.name, self.data_dir, self.budget)
        flat = {**self.reading.flat, **self.extra}
        return apply_flat(cfg, flat) if flat else cfg

    def seeds(self, side: bool = False) -> list[int]:
        """Table 1's seeds, or (``side``) the clustering/RH seeds, a prefix of them."""
        return list(range(self.budget.side_seeds if side else self.budget.seeds))

    def spec(self, label: str, method: str = "fedcure", *, seed: int = 0,
             schedule_only: bool = False, needs: tuple[str, ...] = (), **flat: Any) -> RunSpec:
        """A run of ``method`` (a paper preset) with extra flat overrides applied after it;
        ``needs``: record fields the result must hold (:class:`RunSpec`)."""
        cfg = apply_flat(self.base(), {"method": method})
        cfg = apply_flat(cfg, {"seed": seed, **flat})
        samples = None if schedule_only else self.budget.eval_samples
        return RunSpec(label=f"{label} (seed {seed})", cfg=cfg, eval_samples=samples,
                       schedule_only=schedule_only, needs=needs)

    def folder(self, experiment: str) -> Path:
        """``out_dir/experiment`` (``experiment-<reading>`` under a reading other than the
        literal one), created."""
        p = self.out_dir / self.reading.folder(experiment)
        p.mkdir(parents=True, exist_ok=True)
        return p


@dataclass
class Section:
    """An experiment's outcome for one dataset: Markdown body, PNG figures, raw numbers."""

    experiment: str
    title: str
    dataset: str
    markdown: str
    figures: list[Path] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0
    #: the reading of the paper's setting its runs used (:mod:`.readings`)
    reading: str = LITERAL
    #: the budget its runs used (``tiny``, ``quick``, ``paper``); None when not known
    budget: str | None = None

    def save(self, folder: Path) -> Path:
        """Write ``summary.json`` (numbers, figure names, Markdown) into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "summary.json"
        path.write_text(json.dumps({
            "experiment": self.experiment, "title": self.title, "dataset": self.dataset,
            "wall_seconds": self.wall_seconds, "figures": [f.name for f in self.figures],
            "data": self.data, "markdown": self.markdown, "reading": self.reading,
            "budget": self.budget,
        }, indent=1))
        return path


def final_accuracies(results: list[dict[str, Any]]) -> list[float]:
    """Final test accuracy (fraction) of each result."""
    out = []
    for r in results:
        if r.get("final_accuracy") is None:
            raise ValueError(f"run {r.get('label', '?')} has no final accuracy")
        out.append(float(r["final_accuracy"]))
    return out


def best_accuracies(results: list[dict[str, Any]]) -> list[float]:
    """Best test accuracy (fraction) any evaluation of each result reached."""
    return [float(r["best_accuracy"]) for r in results]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


__all__ = ["Context", "RunSpec", "Section", "best_accuracies", "final_accuracies",
           "markdown_table"]
