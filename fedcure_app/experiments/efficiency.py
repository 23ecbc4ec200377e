"""Fig. 4: per-round latency COV of the schedulers, and virtual queues over rounds for several β.

Schedule-only runs (no training; see :mod:`fedcure_app.experiments.runner`) at the paper's
τ_c = 5, τ_e = 12 over the budget's ``schedule_rounds``:

- COV = std / mean of the latency (s) of the coalition task arriving in each global round (the
  engine's ``latency_cov``), for the five methods, mean ± std over seeds; the COV of the time
  between consecutive arrivals is reported next to it.
- For FedCure with each β of the budget: max_m Λ_m(t) against the round, the simulated time the
  rounds took, and the long-term balance: every coalition's share of rounds against its target
  δ_m, and max_m Λ_m(T)/T (mean-rate stability: → 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcure_app.experiments.base import Context, RunSpec, Section, markdown_table
from fedcure_app.experiments.figures import bar_chart, line_plot
from fedcure_app.experiments.stats import coefficient_of_variation, fmt_mean_std, mean_std
from fedcure_app.experiments.table1 import METHODS

NAME = "efficiency"
TITLE = "Latency COV and virtual queues (Fig. 4)"


def _flat(ctx: Context) -> dict[str, Any]:
    return {"global-rounds": ctx.budget.schedule_rounds, "tau-c": 5, "tau-e": 12,
            "eval-every": ctx.budget.schedule_rounds}


def cov_specs(ctx: Context, method: str) -> list[RunSpec]:
    return [ctx.spec(f"{ctx.name} {METHODS[method]} schedule", method, seed=s,
                     schedule_only=True, **_flat(ctx)) for s in ctx.seeds()]


def beta_spec(ctx: Context, beta: float) -> RunSpec:
    return ctx.spec(f"{ctx.name} FedCure β={beta:g} schedule", "fedcure", seed=0,
                    schedule_only=True, beta=beta, **_flat(ctx))


def plan(ctx: Context) -> list[RunSpec]:
    return ([s for m in METHODS for s in cov_specs(ctx, m)]
            + [beta_spec(ctx, b) for b in ctx.budget.betas])


def interarrival_cov(result: dict[str, Any]) -> float:
    """COV of the simulated time between consecutive global rounds."""
    t = np.array([0.0] + [r["time_s"] for r in result["records"]])
    return coefficient_of_variation(np.diff(t))


def balance(result: dict[str, Any]) -> dict[str, float]:
    """Long-term balance of a run: smallest share/δ ratio and max_m Λ_m(T)/T."""
    share = np.asarray(result["participation"]["share"], dtype=float)
    delta = np.asarray(result["participation"]["delta"], dtype=float)
    q = np.asarray(result["records"][-1]["queues"], dtype=float)
    return {"min_share_over_delta": float((share / delta).min()),
            "max_queue_over_T": float(q.max() / max(1, result["rounds"]))}


def coalition_speed_spread(result: dict[str, Any]) -> float:
    """Slowest over fastest coalition: the ratio of the largest to the smallest mean task
    latency (s) among the coalitions that arrived in a run (1 = all equally fast)."""
    per: dict[int, list[float]] = {}
    for r in result["records"]:
        per.setdefault(int(r["coalition"]), []).append(float(r["latency_s"]))
    means = [float(np.mean(v)) for v in per.values()]
    return max(means) / min(means) if means else float("nan")


def cov_ordering(cov: dict[str, float]) -> str:
    """Whether the paper's Fig. 4(a) ordering holds: FedCure and FedGreedy (which favour fast
    coalitions) each below both FedFair and Fair (which treat all alike)."""
    low, high = ("fedcure", "fedgreedy"), ("fedfair", "fair")
    broken = [f"{METHODS[a]} ≥ {METHODS[b]}" for a in low for b in high if cov[a] >= cov[b]]
    return "holds" if not broken else "does not hold (" + ", ".join(broken) + ")"


def analyse(ctx: Context) -> Section:
    folder = ctx.folder(NAME)
    runs = {m: [ctx.runner.run_one(s) for s in cov_specs(ctx, m)] for m in METHODS}
    cov = {m: [r["latency_cov"] for r in rs] for m, rs in runs.items()}
    icov = {m: [interarrival_cov(r) for r in rs] for m, rs in runs.items()}
    rows = []
    for m, name in METHODS.items():
        b = [balance(r) for r in runs[m]]
        mean_lat = np.mean([np.mean([x["latency_s"] for x in r["records"]]) for r in runs[m]])
        rows.append([name, fmt_mean_std(*mean_std(cov[m]), scale=1.0, digits=4),
                     fmt_mean_std(*mean_std(icov[m]), scale=1.0, digits=4),
                     f"{mean_lat:.2f}",
                     f"{np.mean([x['min_share_over_delta'] for x in b]):.3f}"])
    md = markdown_table(["method", "latency COV", "inter-arrival COV", "mean latency (s)",
                         "min share / δ"], rows)
    betas = {b: ctx.runner.run_one(beta_spec(ctx, b)) for b in ctx.budget.betas}
    brow = []
    for b, r in betas.items():
        bal = balance(r)
        brow.append([f"{b:g}", f"{r['latency_cov']:.4f}", f"{r['simulated_seconds']:.1f}",
                     f"{bal['min_share_over_delta']:.3f}", f"{bal['max_queue_over_T']:.4f}"])
    rounds = ctx.budget.schedule_rounds
    md += "\n\n" + markdown_table(
        ["β", "latency COV", f"simulated time of {rounds} rounds (s)", "min share / δ",
         "max Λ(T) / T"], brow)
    spread = float(np.mean([coalition_speed_spread(r) for r in runs["fedfair"]]))
    means = {m: float(np.mean(v)) for m, v in cov.items()}
    md += (f"\n\nSchedule-only runs: {rounds} global rounds, τ_c = 5, τ_e = 12, "
           f"{len(ctx.seeds())} seed(s) for the COV rows; β sweep with seed 0. "
           f"Slowest / fastest coalition (mean task latency, FedFair runs): ×{spread:.2f}. "
           f"The paper's ordering (FedCure and FedGreedy below FedFair and Fair): "
           f"{cov_ordering(means)}.")
    figures = [
        bar_chart(cov, folder / "latency_cov.png", ylabel="COV of per-round latency",
                  title=f"{ctx.name}: latency COV by method ({rounds} rounds)"),
        line_plot({f"β = {b:g}": [max(x["queues"]) for x in r["records"]]
                   for b, r in betas.items()},
                  folder / "queues_beta.png", xlabel="global round",
                  ylabel="max_m virtual queue Λ_m",
                  x={f"β = {b:g}": [x["round"] for x in r["records"]] for b, r in betas.items()},
                  title=f"{ctx.name}: FedCure's virtual queues for several β"),
    ]
    data = {
        "latency_cov": cov, "interarrival_cov": icov, "coalition_speed_spread": spread,
        "cov_ordering": cov_ordering(means),
        "balance": {m: [balance(r) for r in rs] for m, rs in runs.items()},
        "beta": {f"{b:g}": {"latency_cov": r["latency_cov"],
                            "simulated_seconds": r["simulated_seconds"],
                            "share": r["participation"]["share"],
                            "delta": r["participation"]["delta"], **balance(r)}
                 for b, r in betas.items()},
    }
    return Section(NAME, TITLE, ctx.name, md, figures, data)
