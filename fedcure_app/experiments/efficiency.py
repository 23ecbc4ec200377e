"""Fig. 4: per-round latency COV of the schedulers, and virtual queues over rounds for several β.

Schedule-only runs (no training; see :mod:`fedcure_app.experiments.runner`) at the paper's
τ_c = 5, τ_e = 12 over the budget's ``schedule_rounds``:

- COV = std / mean of the latency (s) of the coalition task arriving in each global round (the
  engine's ``latency_cov``), for the five methods, mean ± std over seeds; the COV of the time
  between consecutive arrivals is reported next to it.
- For FedCure with each β of the budget: max_m Λ_m(t) against the round, the simulated time the
  rounds took, and the long-term balance: every coalition's share of rounds against its target
  δ_m, and max_m Λ_m(T)/T (mean-rate stability: → 0).
- For FedCure with each κ of the budget (every seed): the latency COV, the balance, and what
  decided each scheduling decision (:func:`decisions`): how often the pick is the one the
  queues alone (β = 0) or the latency estimates alone would have made, and how the spread of
  the queues Λ_m among the candidates compares with that of the latency term β·(1 − T̂_m/I).
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


#: Record fields the κ sweep reads (what the scheduler saw at each decision).
DECISION_FIELDS: tuple[str, ...] = ("candidates", "queues_before", "estimates_s")


def kappa_specs(ctx: Context, kappa: float) -> list[RunSpec]:
    """FedCure schedule-only runs at ``kappa``, one per Table 1 seed (κ = 1: the COV runs)."""
    return [ctx.spec(f"{ctx.name} FedCure schedule" if kappa == 1.0 else
                     f"{ctx.name} FedCure κ={kappa:g} schedule", "fedcure", seed=s,
                     schedule_only=True, needs=DECISION_FIELDS, kappa=kappa, **_flat(ctx))
            for s in ctx.seeds()]


def decisions(result: dict[str, Any]) -> dict[str, float]:
    """What decided FedCure's picks in ``result`` (rounds filling one slot from two or more
    candidates): the share of picks equal to the longest queue's among the candidates (what
    β = 0 would pick), the share equal to the fastest candidate's (lowest T̂: what the latency
    term alone would pick), and the median over those decisions of the candidates' queue
    spread max Λ − min Λ over their latency-term spread β·(max T̂ − min T̂)/I (I: mean T̂ of
    all coalitions). NaN without the records' decision fields."""
    beta = float(result["config"]["method"]["beta"])
    n = by_queue = by_speed = 0
    ratios = []
    for rec in result["records"]:
        cands, picks = rec.get("candidates"), rec.get("dispatched", [])
        if cands is None or len(picks) != 1 or len(cands) < 2:
            continue
        c = np.asarray(cands)
        q = np.asarray(rec["queues_before"], dtype=float)[c]
        t_all = np.asarray(rec["estimates_s"], dtype=float)
        t = t_all[c]
        n += 1
        by_queue += int(picks[0] == c[int(np.argmax(q))])
        by_speed += int(picks[0] == c[int(np.argmin(t))])
        lat = beta * (t.max() - t.min()) / t_all.mean()
        if lat > 0:
            ratios.append((q.max() - q.min()) / lat)
    if n == 0:
        return {"decisions": 0, "longest_queue": float("nan"), "fastest": float("nan"),
                "queue_over_latency_spread": float("nan")}
    return {"decisions": n, "longest_queue": by_queue / n, "fastest": by_speed / n,
            "queue_over_latency_spread": float(np.median(ratios)) if ratios else float("inf")}


def beta_spec(ctx: Context, beta: float) -> RunSpec:
    return ctx.spec(f"{ctx.name} FedCure β={beta:g} schedule", "fedcure", seed=0,
                    schedule_only=True, beta=beta, **_flat(ctx))


def plan(ctx: Context) -> list[RunSpec]:
    return ([s for m in METHODS for s in cov_specs(ctx, m)]
            + [beta_spec(ctx, b) for b in ctx.budget.betas]
            + [s for k in ctx.budget.kappas for s in kappa_specs(ctx, k)])


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


def slow_share(result: dict[str, Any]) -> float:
    """Share of a run's global rounds that went to its slower half: the ⌊M/2⌋ coalitions with
    the highest mean task latency (s) among those that arrived (never-arrived ones count as
    slowest, with no rounds)."""
    m = len(result["participation"]["rounds"])
    per: dict[int, list[float]] = {}
    for r in result["records"]:
        per.setdefault(int(r["coalition"]), []).append(float(r["latency_s"]))
    mean = {c: float(np.mean(per[c])) if c in per else float("inf") for c in range(m)}
    slow = sorted(mean, key=lambda c: -mean[c])[: m // 2]
    rounds = np.asarray(result["participation"]["rounds"], dtype=float)
    return float(rounds[slow].sum() / max(1.0, rounds.sum()))


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
                     f"{np.mean([x['min_share_over_delta'] for x in b]):.3f}",
                     f"{np.mean([slow_share(r) for r in runs[m]]):.3f}"])
    md = markdown_table(["method", "latency COV", "inter-arrival COV", "mean latency (s)",
                         "min share / δ", "rounds to the slower half"], rows)
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
    slow = {m: float(np.mean([slow_share(r) for r in rs])) for m, rs in runs.items()}
    kappa_md, kappa_data, kappa_cov = kappa_sweep(ctx, means, slow)
    md += "\n\n" + kappa_md
    figures = [
        bar_chart(cov, folder / "latency_cov.png", ylabel="COV of per-round latency",
                  title=f"{ctx.name}: latency COV by method ({rounds} rounds)"),
        line_plot({f"β = {b:g}": [max(x["queues"]) for x in r["records"]]
                   for b, r in betas.items()},
                  folder / "queues_beta.png", xlabel="global round",
                  ylabel="max_m virtual queue Λ_m",
                  x={f"β = {b:g}": [x["round"] for x in r["records"]] for b, r in betas.items()},
                  title=f"{ctx.name}: FedCure's virtual queues for several β"),
        bar_chart(kappa_cov, folder / "latency_cov_kappa.png", ylabel="COV of per-round latency",
                  title=f"{ctx.name}: FedCure's latency COV against κ ({rounds} rounds)"),
    ]
    data = {
        "latency_cov": cov, "interarrival_cov": icov, "coalition_speed_spread": spread,
        "cov_ordering": cov_ordering(means),
        "balance": {m: [balance(r) for r in rs] for m, rs in runs.items()},
        "slow_share": {m: [slow_share(r) for r in rs] for m, rs in runs.items()},
        "beta": {f"{b:g}": {"latency_cov": r["latency_cov"],
                            "simulated_seconds": r["simulated_seconds"],
                            "share": r["participation"]["share"],
                            "delta": r["participation"]["delta"], **balance(r)}
                 for b, r in betas.items()},
        "kappa": kappa_data,
    }
    return Section(NAME, TITLE, ctx.name, md, figures, data)


def kappa_sweep(ctx: Context, cov_means: dict[str, float], slow_means: dict[str, float]
                ) -> tuple[str, dict[str, Any], dict[str, list[float]]]:
    """The κ sweep's table, the sentences that read it, its numbers, and COVs per κ label;
    ``cov_means``/``slow_means``: each method's mean latency COV and slower-half share."""
    rows, data, covs = [], {}, {}
    for k in ctx.budget.kappas:
        runs = [ctx.runner.run_one(s) for s in kappa_specs(ctx, k)]
        cov = [r["latency_cov"] for r in runs]
        dec = [decisions(r) for r in runs]
        bal = [balance(r) for r in runs]
        entry = {
            "latency_cov": cov,
            "min_share_over_delta": [b["min_share_over_delta"] for b in bal],
            "max_queue_over_T": [b["max_queue_over_T"] for b in bal],
            "decisions": dec,
            "slow_share": [slow_share(r) for r in runs],
        }
        data[f"{k:g}"] = entry
        covs[f"κ = {k:g}"] = cov
        rows.append([f"{k:g}", fmt_mean_std(*mean_std(cov), scale=1.0, digits=4),
                     f"{np.mean(entry['min_share_over_delta']):.3f}",
                     f"{np.mean(entry['slow_share']):.3f}",
                     f"{100 * np.mean([d['longest_queue'] for d in dec]):.0f}",
                     f"{100 * np.mean([d['fastest'] for d in dec]):.0f}",
                     f"{np.median([d['queue_over_latency_spread'] for d in dec]):.2f}"])
    md = markdown_table(["κ", "latency COV", "min share / δ", "rounds to the slower half",
                         "picks = longest queue among candidates (%)",
                         "picks = fastest candidate (%)",
                         "queue spread / latency-term spread (median)"], rows)
    first, low = f"{ctx.budget.kappas[0]:g}", f"{min(ctx.budget.kappas):g}"

    def mean_of(k: str, what: str) -> float:
        if what in ("longest_queue", "fastest"):
            return 100 * float(np.mean([d[what] for d in data[k]["decisions"]]))
        return float(np.mean(data[k][what]))

    md += (f"\n\nFedCure schedule-only runs, {ctx.budget.schedule_rounds} global rounds, "
           f"β = 0.5, {len(ctx.seeds())} seed(s) per κ; δ_m = κ·|D_m|/|D|. A decision is a "
           "round whose arrival frees one slot with two or more idle coalitions to choose from; "
           "the queue spread is max Λ − min Λ over those candidates, the latency-term spread "
           "β·(max T̂ − min T̂)/I. From κ = "
           f"{first} to {low} FedCure's picks follow the longest queue in "
           f"{mean_of(first, 'longest_queue'):.0f} % → {mean_of(low, 'longest_queue'):.0f} % "
           f"of the decisions and the fastest candidate in {mean_of(first, 'fastest'):.0f} % → "
           f"{mean_of(low, 'fastest'):.0f} %, and its slower half's share of the rounds goes "
           f"from {mean_of(first, 'slow_share'):.3f} to {mean_of(low, 'slow_share'):.3f}; its "
           f"latency COV moves from {mean_of(first, 'latency_cov'):.4f} to "
           f"{mean_of(low, 'latency_cov'):.4f}. For comparison, FedGreedy gives its slower "
           f"half {slow_means['fedgreedy']:.3f} of the rounds (COV "
           f"{cov_means['fedgreedy']:.4f}), FedFair {slow_means['fedfair']:.3f} (COV "
           f"{cov_means['fedfair']:.4f}).")
    return md, data, covs
