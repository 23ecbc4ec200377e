"""Table 1: final test accuracy of Greedy, Fair, FedGreedy, FedFair and FedCure, mean ± std over
seeds, with Cohen's d of FedCure over FedFair (edge non-IID, the budget's federation)."""

from __future__ import annotations

from typing import Any

from fedcure_app.experiments.base import (
    Context,
    RunSpec,
    Section,
    best_accuracies,
    final_accuracies,
    markdown_table,
)
from fedcure_app.experiments.figures import accuracy_curves, bar_chart
from fedcure_app.experiments.stats import cohens_d, fmt_d, fmt_mean_std, mean_std

NAME = "table1"
TITLE = "Accuracy of the five methods (Table 1)"

#: Row order and display names, as in the paper.
METHODS: dict[str, str] = {
    "greedy": "Greedy", "fair": "Fair", "fedgreedy": "FedGreedy", "fedfair": "FedFair",
    "fedcure": "FedCure",
}


def specs(ctx: Context, method: str) -> list[RunSpec]:
    """One run of ``method`` per Table 1 seed."""
    return [ctx.spec(f"{ctx.name} {METHODS[method]}", method, seed=s) for s in ctx.seeds()]


def plan(ctx: Context) -> list[RunSpec]:
    return [s for m in METHODS for s in specs(ctx, m)]


def late_gain(result: dict[str, Any], tail: float = 0.1) -> float:
    """Accuracy gained (fraction) over the run's last ``tail`` of global rounds: the last
    evaluation minus the last one at or before round (1 − tail)·rounds (0 if none)."""
    evals = [(r["round"], r["accuracy"]) for r in result["records"] if r["accuracy"] is not None]
    if not evals:
        return 0.0
    cut = (1.0 - tail) * result["rounds"]
    before = [a for rnd, a in evals if rnd <= cut]
    return float(evals[-1][1] - before[-1]) if before else 0.0


def analyse(ctx: Context) -> Section:
    folder = ctx.folder(NAME)
    runs: dict[str, list[dict[str, Any]]] = {
        m: [ctx.runner.run_one(s) for s in specs(ctx, m)] for m in METHODS
    }
    acc = {m: final_accuracies(rs) for m, rs in runs.items()}
    best = {m: best_accuracies(rs) for m, rs in runs.items()}
    stats = {m: mean_std(v) for m, v in acc.items()}
    n = len(ctx.seeds())
    d = cohens_d(acc["fedcure"], acc["fedfair"]) if n >= 2 else None
    rows = []
    for m, name in METHODS.items():
        mu, sd = stats[m]
        bmu, bsd = mean_std(best[m])
        share = [min(r["participation"]["share"]) for r in runs[m]]
        rows.append([name, fmt_mean_std(mu, sd), fmt_mean_std(bmu, bsd),
                     f"{sum(r['formed_jsd'] for r in runs[m]) / n:.3f}",
                     f"{sum(share) / n:.3f}"])
    md = markdown_table(["method", "final accuracy (%)", "best accuracy (%)",
                         "JSD of the coalitions", "smallest coalition share"], rows)
    md += (f"\n\nMean ± sample std over {n} seed(s). Cohen's d (FedCure over FedFair, final "
           f"accuracy): **{fmt_d(d) if d is not None else 'n/a (one seed)'}**.")
    figures = [
        bar_chart({METHODS[m]: v for m, v in acc.items()}, folder / "accuracy_bars.png",
                  ylabel="final test accuracy (%)", scale=100.0,
                  title=f"{ctx.name}: final accuracy, mean ± std over {n} seed(s)"),
        accuracy_curves({METHODS[m]: rs for m, rs in runs.items()}, folder / "accuracy.png",
                        title=f"{ctx.name}: test accuracy (mean over seeds, band min–max)"),
    ]
    data = {
        "seeds": ctx.seeds(),
        "final_accuracy": acc,
        "best_accuracy": best,
        "mean_std": {m: list(v) for m, v in stats.items()},
        "cohens_d_fedcure_vs_fedfair": d,
        "formed_jsd": {m: [r["formed_jsd"] for r in rs] for m, rs in runs.items()},
        "latency_cov": {m: [r["latency_cov"] for r in rs] for m, rs in runs.items()},
        "simulated_seconds": {m: [r["simulated_seconds"] for r in rs] for m, rs in runs.items()},
        "shares": {m: [r["participation"]["share"] for r in rs] for m, rs in runs.items()},
        "late_gain": {m: [late_gain(r) for r in rs] for m, rs in runs.items()},
        "max_concurrent": ctx.base().concurrency,
    }
    return Section(NAME, TITLE, ctx.name, md, figures, data)
