"""The supplement: accuracy of RH-style self-centred (selfish) coalition formation against
FedCure's coalition-friendly rule, both scheduled by FedCure's rule, on the main federation."""

from __future__ import annotations

from typing import Any

from fedcure_app.experiments.base import (
    Context,
    RunSpec,
    Section,
    final_accuracies,
    markdown_table,
)
from fedcure_app.experiments.figures import accuracy_curves, bar_chart
from fedcure_app.experiments.stats import fmt_mean_std, mean_std

NAME = "rh"
TITLE = "RH-style selfish formation against FedCure's (supplement)"

RULES: dict[str, str] = {"selfish": "RH (selfish)", "fedcure": "FedCure"}


def specs(ctx: Context, rule: str) -> list[RunSpec]:
    return [ctx.spec(f"{ctx.name} {RULES[rule]} formation", "fedcure", seed=s, formation=rule)
            for s in ctx.seeds(side=True)]


def plan(ctx: Context) -> list[RunSpec]:
    return [s for r in RULES for s in specs(ctx, r)]


def analyse(ctx: Context) -> Section:
    folder = ctx.folder(NAME)
    runs: dict[str, list[dict[str, Any]]] = {
        r: [ctx.runner.run_one(s) for s in specs(ctx, r)] for r in RULES
    }
    acc = {r: final_accuracies(rs) for r, rs in runs.items()}
    rows = []
    for r, name in RULES.items():
        mu, sd = mean_std(acc[r])
        jsd0 = runs[r][0]["initial_jsd"]
        jsd = sum(x["formed_jsd"] for x in runs[r]) / len(runs[r])
        rows.append([name, f"{jsd0:.4f} → {jsd:.4f}", fmt_mean_std(mu, sd)])
    gap = 100 * (mean_std(acc["fedcure"])[0] - mean_std(acc["selfish"])[0])
    md = markdown_table(["formation rule", "JSD before → after (nats)", "final accuracy (%)"],
                        rows)
    md += (f"\n\nFedCure − RH: **{gap:+.2f} points** of final accuracy "
           f"({len(ctx.seeds(side=True))} seed(s), FedCure's scheduler in both rows).")
    figures = [
        bar_chart({RULES[r]: v for r, v in acc.items()}, folder / "accuracy_bars.png",
                  ylabel="final test accuracy (%)", scale=100.0,
                  title=f"{ctx.name}: RH (selfish) vs FedCure formation"),
        accuracy_curves({RULES[r]: rs for r, rs in runs.items()}, folder / "accuracy.png",
                        title=f"{ctx.name}: test accuracy, RH (selfish) vs FedCure formation"),
    ]
    data = {"final_accuracy": acc, "gap_points": gap,
            "formed_jsd": {r: [x["formed_jsd"] for x in rs] for r, rs in runs.items()}}
    return Section(NAME, TITLE, ctx.name, md, figures, data)
