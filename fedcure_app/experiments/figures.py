"""Matplotlib (Agg) figures shared by the experiments: bars with error bars, curves over rounds."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

log = logging.getLogger(__name__)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    log.info("wrote %s", path)
    return path


def bar_chart(values: Mapping[str, Sequence[float]], path: Path, *, ylabel: str, title: str,
              scale: float = 1.0) -> Path:
    """One bar per key: mean of its values (× ``scale``), sample std as the error bar."""
    names = list(values)
    means = [scale * float(np.mean(values[k])) for k in names]
    stds = [scale * float(np.std(values[k], ddof=1)) if len(values[k]) > 1 else 0.0
            for k in names]
    fig = Figure(figsize=(max(4.5, 1.1 * len(names) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(names))
    ax.bar(x, means, yerr=stds, capsize=4, color=[f"C{i}" for i in range(len(names))])
    for i, m in enumerate(means):
        ax.text(i, m, f"{m:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def accuracy_curves(runs: Mapping[str, Sequence[dict[str, Any]]], path: Path, *,
                    title: str, reference: tuple[float, str] | None = None,
                    size: tuple[float, float] = (6.2, 4.0)) -> Path:
    """Test accuracy (%) against the global round: per key, the mean over its runs (and a band
    from the min to the max when there are several); ``reference``: (accuracy in %, label) drawn
    as a dashed horizontal line (a published number)."""
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    if reference is not None:
        ax.axhline(reference[0], color="black", ls="--", lw=1.0, label=reference[1])
    for i, (name, results) in enumerate(runs.items()):
        series = []
        for r in results:
            pts = {rec["round"]: rec["accuracy"] for rec in r["records"]
                   if rec.get("accuracy") is not None}
            series.append(pts)
        rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not rounds:
            continue
        acc = 100 * np.array([[s[t] for t in rounds] for s in series])
        ax.plot(rounds, acc.mean(axis=0), color=f"C{i}", label=name, marker="o", ms=2.5)
        if acc.shape[0] > 1:
            ax.fill_between(rounds, acc.min(axis=0), acc.max(axis=0), color=f"C{i}", alpha=0.15)
    ax.set_xlabel("global round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def line_plot(series: Mapping[str, Sequence[float]], path: Path, *, xlabel: str, ylabel: str,
              title: str, x: Mapping[str, Sequence[float]] | None = None,
              drawstyle: str = "default") -> Path:
    """One line per key (x defaults to 0, 1, 2, …)."""
    fig = Figure(figsize=(6.2, 4.0), layout="constrained")
    ax = fig.subplots()
    for i, (name, ys) in enumerate(series.items()):
        xs = list(x[name]) if x is not None else list(range(len(ys)))
        ax.plot(xs, list(ys), color=f"C{i}", label=name, lw=1.3, drawstyle=drawstyle,
                marker="o" if len(ys) <= 60 else None, ms=3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


__all__ = ["accuracy_curves", "bar_chart", "line_plot"]
