"""Fig. 3: accuracy with the initial (edge non-IID) coalitions, K-Means (K = number of ESs),
Mean-Shift and FedCure's formation, all scheduled by FedCure's rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcure_app.experiments.base import (
    Context,
    RunSpec,
    Section,
    best_accuracies,
    final_accuracies,
    markdown_table,
)
from fedcure_app.experiments.figures import accuracy_curves, bar_chart
from fedcure_app.experiments.stats import fmt_mean_std, mean_std

NAME = "clustering"
TITLE = "Clustering baselines against FedCure's formation (Fig. 3)"

FORMATIONS: dict[str, str] = {
    "none": "initial", "kmeans": "K-Means", "meanshift": "Mean-Shift", "fedcure": "FedCure",
}


def specs(ctx: Context, formation: str) -> list[RunSpec]:
    """One FedCure-scheduled run with ``formation`` per side seed."""
    return [ctx.spec(f"{ctx.name} {FORMATIONS[formation]} formation", "fedcure", seed=s,
                     formation=formation) for s in ctx.seeds(side=True)]


def plan(ctx: Context) -> list[RunSpec]:
    return [s for f in FORMATIONS for s in specs(ctx, f)]


def fig3_ratio(best: dict[str, list[float]]) -> float:
    """Fig. 3's measure: mean best accuracy with FedCure's coalitions over that with the
    initial ones (the paper: MNIST 1.40×)."""
    initial = float(np.mean(best["none"]))
    return float(np.mean(best["fedcure"])) / initial if initial > 0 else float("inf")


def analyse(ctx: Context) -> Section:
    folder = ctx.folder(NAME)
    runs: dict[str, list[dict[str, Any]]] = {
        f: [ctx.runner.run_one(s) for s in specs(ctx, f)] for f in FORMATIONS
    }
    acc = {f: final_accuracies(rs) for f, rs in runs.items()}
    k = ctx.budget.edges
    rows = []
    for f, name in FORMATIONS.items():
        mu, sd = mean_std(acc[f])
        jsd = sum(r["formed_jsd"] for r in runs[f]) / len(runs[f])
        sizes = [len(c) for c in runs[f][0]["coalitions"]]
        label = f"K-Means (K = {k})" if f == "kmeans" else name
        rows.append([label, f"{jsd:.4f}", f"{min(sizes)}–{max(sizes)}", fmt_mean_std(mu, sd)])
    n = len(ctx.seeds(side=True))
    md = markdown_table(["coalitions", "JSD (nats)", "clients per coalition",
                         "final accuracy (%)"], rows)
    md += f"\n\nScheduler: FedCure's rule in every row; {n} seed(s)."
    figures = [
        bar_chart({FORMATIONS[f]: v for f, v in acc.items()}, folder / "accuracy_bars.png",
                  ylabel="final test accuracy (%)", scale=100.0,
                  title=f"{ctx.name}: accuracy by coalition formation"),
        accuracy_curves({FORMATIONS[f]: rs for f, rs in runs.items()}, folder / "accuracy.png",
                        title=f"{ctx.name}: test accuracy by coalition formation"),
    ]
    best = {f: best_accuracies(rs) for f, rs in runs.items()}
    ratio = fig3_ratio(best)
    md += (f" Fig. 3's measure, the best accuracy with FedCure's coalitions over the initial "
           f"ones: ×{ratio:.2f}.")
    data = {
        "final_accuracy": acc, "best_accuracy": best, "fig3_ratio": ratio,
        "formed_jsd": {f: [r["formed_jsd"] for r in rs] for f, rs in runs.items()},
        "coalition_sizes": {f: [len(c) for c in rs[0]["coalitions"]] for f, rs in runs.items()},
    }
    return Section(NAME, TITLE, ctx.name, md, figures, data)
