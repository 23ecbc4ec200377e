"""``report.md``: the budget, the skipped datasets, our numbers next to the paper's (with the gap
and our reading of it), every experiment's tables and embedded PNG figures, and the
configuration used."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedcure_app.experiments.base import markdown_table
from fedcure_app.experiments.paper import (
    PAPER,
    PAPER_FIG3_RATIO,
    PAPER_TABLE1,
    SOURCE_FIG3,
)
from fedcure_app.experiments.readings import LITERAL, READINGS
from fedcure_app.experiments.report_table1 import (
    FORMED,
    PLAIN,
    OurTable1,
    _table1_combined,
    labelled,
    ordering_line,
    our_table1,
    rank_order,
    reading_sections,
    table1_comparison,
)
from fedcure_app.experiments.stats import fmt_d, mean_std
from fedcure_app.experiments.suite import REPORT_ORDER, DatasetOutcome
from fedcure_app.experiments.table1 import METHODS

#: The paper's formed variants (on FedCure's coalitions) and the plain baselines.
log = logging.getLogger(__name__)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _budget_table(outcomes: Sequence[DatasetOutcome]) -> str:
    rows = []
    for o in outcomes:
        b = o.budget
        if b is None:
            continue
        rows.append([o.name, b.name, f"{b.clients} / {b.edges}", str(b.rounds), str(b.tau_c),
                     str(b.tau_e), f"{b.lr:g}", f"{b.seeds} / {b.side_seeds}",
                     str(o.test_samples), f"{b.schedule_rounds}, β ∈ "
                     f"{{{', '.join(f'{x:g}' for x in b.betas)}}}",
                     _minutes(o.compute_seconds), _minutes(o.wall_seconds),
                     f"{o.runs_simulated} ({o.runs_cached})"])
    return markdown_table(
        ["dataset", "budget", "clients / ESs", "global rounds", "τ_c", "τ_e", "lr",
         "seeds (Table 1 / Fig. 3, RH)", "test samples", "schedule-only rounds",
         "simulation time (sum over runs)", "wall time of this command",
         "runs simulated (from cache)"], rows)


def _cov_reason(data: dict, covs: dict[str, float]) -> str:
    """Our measured reading of the latency COVs (Fig. 4(a)) from the efficiency data."""
    spread = data.get("coalition_speed_spread")
    beta = data.get("beta", {})
    shares = [b["min_share_over_delta"] for b in data["balance"]["fedcure"]]
    text = ("Latencies are simulated: device profiles with lognormal jitter, each ES's access "
            "network capping its clients' links (docs/DESIGN.md, 'Simulated devices and "
            "networks')")
    text += (f", so the coalitions differ in speed (slowest/fastest ×{spread:.2f}). "
             if spread is not None else ". ")
    text += ("Greedy and FedGreedy favour the fast coalitions and have the lower COVs, as in "
             "the paper. FedCure cannot do so here: with κ = 1 the targets δ_m = |D_m|/|D| sum "
             "to 1, so mean-rate stability holds only if every coalition gets its data share of "
             f"rounds (FedCure's smallest share/δ: {np.mean(shares):.3f}), the same mix of fast "
             "and slow tasks as FedFair, whence about the same COV (FedCure "
             f"{covs['fedcure']:.4f}, FedFair {covs['fedfair']:.4f}).")
    if beta:
        sweep = ", ".join(f"β = {b}: {v['latency_cov']:.4f}" for b, v in beta.items())
        top = max(beta, key=float)
        text += (f" Only a latency weight far above the paper's lowers it, by giving up the "
                 f"balance (seed 0, {sweep}; at β = {top} the smallest share/δ is "
                 f"{beta[top]['min_share_over_delta']:.3f}); we keep the paper's β = 0.5 rather "
                 "than tune toward its number.")
    text += _kappa_reason(data)
    return text


def _kappa_reason(data: dict) -> str:
    """What the efficiency section's κ sweep shows about the COV (empty without it)."""
    kap = data.get("kappa")
    slow = data.get("slow_share")
    if not kap or len(kap) < 2 or not slow:
        return ""
    first = next(iter(kap))
    low = min(kap, key=float)

    def pct(k: str, what: str) -> float:
        return 100 * float(np.mean([d[what] for d in kap[k]["decisions"]]))

    return (f" Lowering κ frees the queues from the data-share targets (the κ sweep in the "
            f"efficiency section): at κ = {low} FedCure's picks follow the fastest candidate in "
            f"{pct(low, 'fastest'):.0f} % of the decisions against {pct(first, 'fastest'):.0f} % "
            f"at κ = {first}, but an idle slow coalition's queue grows by δ_m every round it "
            "waits until it outweighs the latency term, so FedCure's slower half of the "
            f"coalitions still gets {np.mean(kap[low]['slow_share']):.3f} of the rounds "
            f"(κ = {first}: {np.mean(kap[first]['slow_share']):.3f}; FedGreedy "
            f"{np.mean(slow['fedgreedy']):.3f}) and its COV only goes from "
            f"{np.mean(kap[first]['latency_cov']):.4f} to {np.mean(kap[low]['latency_cov']):.4f}: "
            "as long as fast and slow tasks both arrive, the COV stays near FedFair's; it falls "
            "only once the slow coalitions are left out, as FedGreedy (or β = 100) does.")


def _gap_rows(done: Sequence[DatasetOutcome]) -> list[list[str]]:
    """One row per headline claim of the paper: paper value, ours, difference, our reading."""
    rows: list[list[str]] = []
    jb, ja = PAPER["jsd_before"], PAPER["jsd_after"]
    for o in done:
        f = o.sections.get("formation")
        if f is None:
            continue
        main = f.data["main"]
        before, after = main["initial_jsd"], main["final_jsd"]
        why = ("Edge non-IID gives each ES 2 classes no other ES has, so the coalitions' label "
               f"sets are disjoint and the JSD is ln 2 = {math.log(2):.4f}; the paper's 0.69 is "
               "that value rounded. ")
        if after > 1e-3:
            why += ("The residual after formation comes from whole clients (each holding one "
                    "class) not splitting every class evenly over the coalitions.")
        else:
            why += ("Formation reaches (numerically) identical coalition label mixes, as in "
                    "the paper.")
        rows.append([f"JSD before → after formation ({o.name}, {main['clients']} / "
                     f"{main['edges']})", f"{jb.value:.2f} → {ja.value:.2f}",
                     f"{before:.4f} → {after:.4f}",
                     f"{before - jb.value:+.4f} / {after - ja.value:+.4f}", why])
    pc = PAPER["lowest_latency_cov"]
    for o, reading, e in ((o, r, e) for o in done for r, e in reading_sections(o, "efficiency")):
        covs = {m: float(np.mean(v)) for m, v in e.data["latency_cov"].items()}
        lowest = min(covs, key=covs.get)
        ours = covs["fedcure"]
        why = (f"Lowest here: {METHODS[lowest]} ({covs[lowest]:.4f}); the paper's ordering "
               f"(FedCure and FedGreedy below FedFair and Fair) {e.data['cov_ordering']}. ")
        why += _cov_reason(e.data, covs)
        rows.append([f"latency COV of FedCure ({labelled(o.name, reading)})",
                     f"{pc.value:.4f} (lowest of all)",
                     f"{ours:.4f}", f"×{ours / pc.value:.1f}", why])
    for o, reading, c in ((o, r, c) for o in done for r, c in reading_sections(o, "clustering")):
        if "fig3_ratio" not in c.data:
            continue
        ours_ratio = c.data["fig3_ratio"]
        paper_ratio = PAPER_FIG3_RATIO.get(o.name)
        bests = c.data["best_accuracy"]
        rows.append([
            f"best accuracy, FedCure's coalitions / initial ones "
            f"({labelled(o.name, reading)}, Fig. 3)",
            f"{paper_ratio:.2f}x" if paper_ratio is not None else "not reported",
            f"{ours_ratio:.2f}x ({100 * np.mean(bests['fedcure']):.2f} % / "
            f"{100 * np.mean(bests['none']):.2f} %)",
            f"{ours_ratio - paper_ratio:+.2f}" if paper_ratio is not None else "",
            "Both rows use FedCure's scheduler; only the coalitions differ. The initial edge "
            "non-IID coalitions hold 2 classes each, so the global model swings toward the "
            "classes of the last arrivals, and its best accuracy depends on how often a mix "
            "of coalitions happens to be balanced at an evaluation; the ratio is that best "
            "over the formed coalitions' (near their plateau)."])
    pr = PAPER["max_accuracy_ratio"]
    best = None
    for o, reading, t in ((o, r, t) for o in done for r, t in reading_sections(o, "table1")):
        acc = {m: float(np.mean(v)) for m, v in t.data["final_accuracy"].items()}
        worst = min((m for m in acc if m != "fedcure"), key=acc.get)
        ratio = acc["fedcure"] / max(acc[worst], 1e-9)
        if best is None or ratio > best[0]:
            best = (ratio, labelled(o.name, reading), worst)
    for o, reading, t in ((o, r, t) for o in done for r, t in reading_sections(o, "table1")):
        acc = {m: float(np.mean(v)) for m, v in t.data["final_accuracy"].items()}
        runner_up = max((m for m in acc if m != "fedcure"), key=acc.get)
        margin = 100 * (acc["fedcure"] - acc[runner_up])
        d = t.data["cohens_d_fedcure_vs_fedfair"]
        rows.append([f"FedCure most accurate of the five ({labelled(o.name, reading)})",
                     "yes (it improves on all four baselines)",
                     f"{'yes' if margin > 0 else 'no'}: {margin:+.2f} points over "
                     f"{METHODS[runner_up]}",
                     f"Cohen's d vs FedFair {fmt_d(d) if d is not None else 'n/a'}",
                     _formed_gap_reason(t.data["final_accuracy"], margin)])
    if best is not None:
        ratio, name, worst = best
        rows.append(["largest accuracy ratio FedCure / baseline", f"up to {pr.value:.1f}x",
                     f"{ratio:.2f}x ({name}, over {METHODS[worst]})",
                     f"{ratio - pr.value:+.2f}",
                     "The ratio is set by the weakest baseline: without formation every "
                     "coalition holds 2 classes, so Greedy/Fair end near the accuracy of the "
                     "last 2-class edge models mixed in; how low that is depends on the dataset, "
                     "the number of rounds and which coalition arrived last."])
    return rows


def readings_note(done: Sequence[DatasetOutcome]) -> list[str]:
    """What each reading in the report changes and why (nothing when only the literal one is
    there)."""
    used = {s.reading for o in done for s in o.sections.values()}
    if used <= {LITERAL}:
        return []
    lines = ["Readings of the paper's setting in this report (columns and rows say which; "
             "unlabelled ones are the literal reading):", ""]
    lines += [f"- **{r.name}** ({r.label}): {r.why}." for r in READINGS.values()
              if r.name in used or r.name == LITERAL]
    return lines + [""]


def _paper_section(done: Sequence[DatasetOutcome]) -> str:
    parts = ["## Our numbers next to the paper's", "", *readings_note(done),
             "### Table 1 — final test accuracy (%), edge non-IID, mean ± std over seeds", "",
             _table1_combined(done), "", "### The paper's headline claims", ""]
    rows = _gap_rows(done)
    if rows:
        parts.append(markdown_table(["claim", "paper", "ours", "difference", "why we think so"],
                                    rows))
    sources = sorted({p.source for p in PAPER.values()} | {PAPER_TABLE1.source, SOURCE_FIG3})
    parts += ["", "Sources: " + "; ".join(sources) + ".", "", _differences_note(done)]
    return "\n".join(parts)


def _formed_gap_reason(final: dict[str, list[float]], margin: float) -> str:
    """Why FedCure's lead (or lag) among the five is what it is, from the measured spread.

    ``final`` maps method -> final accuracies (0–1) per seed; ``margin`` is FedCure's mean
    minus the best other method's mean, in points.
    """
    stats = {m: mean_std(v) for m, v in final.items()}
    formed = [m for m in FORMED if m in final]
    plain = [m for m in PLAIN if m in final]
    seeds = min(len(final[m]) for m in formed)
    text = "The big step comes from formation"
    if plain:
        step = 100 * (stats["fedcure"][0] - max(stats[m][0] for m in plain))
        text += f" ({step:+.1f} points over the better of Greedy and Fair)"
    text += "; among the three formed variants the scheduler decides the rest"
    if seeds < 2:
        return text + f", and with {seeds} seed there is no spread to compare the gap with."
    spread = 100 * max(stats[m][1] for m in formed)
    within = "within" if abs(margin) <= spread else "larger than"
    return (text + f": the gap ({abs(margin):.2f} points) is {within} the seed-to-seed "
            f"spread (largest std among them {spread:.2f} points, {seeds} seeds).")


def _differences_note(done: Sequence[DatasetOutcome]) -> str:
    """Why our numbers differ from the paper's, for the budgets in ``done``."""
    common = ("Devices and latencies are simulated (device presets, each ES's access network "
              "capping its clients' links, lognormal jitter), not the paper's testbed, so which "
              "coalition arrives when, and how stale its model is, differ from the paper's runs; "
              "the paper does not give its CNNs' channel widths (ours: models.py) or its "
              "optimiser beyond the learning rate (ours: plain SGD, no momentum or weight "
              "decay).")
    if any(o.name == "digits" for o in done):
        common += (" The digits dataset is scikit-learn's 8×8 digits set (1,437 training "
                   "images), not one of the paper's datasets.")
    if all(o.budget is not None and o.budget.name == "paper" for o in done):
        return ("Why ours can differ from the paper's at its own budget: " + common
                + " We ran fewer seeds than the paper's 5 where the budget table says so, so "
                "our ± is rougher. How far training gets in the paper's 100–200 global rounds "
                "rests on readings the paper leaves open: we read τ_c = 5 'rounds of local "
                "training' as 5 mini-batch steps (docs/DESIGN.md); read as 5 local epochs, a "
                "MNIST client (1,200 samples, 38 batches) would train about 38× longer per edge "
                "round. And the cloud moves the global model a fraction ξ = ℓ·k^φ ≤ ℓ = 0.2 "
                "toward each arriving edge model, so each global round adds at most a fifth of "
                "an edge model's progress. Where the per-method lines above show the accuracy "
                "still rising at the end, the run had not converged.")
    return ("General reasons our accuracies sit below a full-length run: below the paper "
            "budget we train for far fewer global rounds and edge rounds than the paper (see "
            "the budget table) and compensate only partly with a larger learning rate. "
            + common)


def _dataset_section(o: DatasetOutcome, out: Path) -> str:
    lines = [f"## {o.name}", ""]
    keys = [r.folder(exp) for exp in REPORT_ORDER for r in READINGS.values()]
    for key in dict.fromkeys(keys):
        s = o.sections.get(key)
        if s is None:
            continue
        title = s.title if s.reading == LITERAL else (
            f"{s.title} — reading: {READINGS[s.reading].label}")
        lines += [f"### {title}", "", s.markdown, ""]
        for fig in s.figures:
            rel = fig.relative_to(out) if fig.is_absolute() == out.is_absolute() else fig
            lines.append(f"![{s.experiment}: {fig.stem}]({rel.as_posix()})")
        lines += ["", f"_Wall time: {_minutes(s.wall_seconds)}._", ""]
    return "\n".join(lines)


def write_report(outcomes: Sequence[DatasetOutcome], out: Path, *, command: str,
                 total_seconds: float, threads: int | None = None) -> Path:
    """Write ``out/report.md`` and return its path."""
    done = [o for o in outcomes if o.skipped is None]
    skipped = [o for o in outcomes if o.skipped is not None]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [
        "# FedCure — reproducing the paper", "",
        f"Generated by `{command}`: {_minutes(total_seconds)} of wall time on "
        f"{cores} CPU core(s) ({platform.processor() or platform.machine()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, "
        f"{threads or torch.get_num_threads()} torch thread(s). Every figure below is a PNG "
        "next to this file; raw numbers are in each experiment's `summary.json`. Runs already "
        "in the cache (`<dataset>/runs/`) are not simulated again; the simulation-time column "
        "sums each run's own wall time as measured when it ran (runs that shared the machine "
        "with other work took longer than they would alone)."
        + (" `DIR` is the folder holding the datasets' files (MNIST: its four IDX files in "
           "`DIR/mnist/raw`)." if "--data-dir DIR" in command else ""), "",
        "## Budget", "", _budget_table(outcomes), "",
        "Everything not in the table keeps the paper's defaults: edge non-IID partition "
        "(2 classes per ES), ℓ = 0.2, k = 0.95, β = 0.5, K = ⌈M/2⌉ coalitions training at "
        "once, batch 32. The paper's setting is `--budget paper` (τ_c = 5, τ_e = 12, "
        "100–200 global rounds, lr 0.01, 0.005 for SVHN, 5 seeds). Accuracy is measured on "
        "the listed number of test samples (a fixed seeded subset where smaller than the test "
        "split). Schedule-only runs (Fig. 4) replay the scheduler and the simulated clock "
        "without training: latencies and queues do not depend on the model.", "",
    ]
    recoded = [o for o in done if "re-encoding" in o.source]
    if recoded:
        parts += [f"**{o.name}** was read from a re-encoded copy: "
                  f"{o.source.split(' (', 1)[-1].rstrip(')')}. Its accuracies are close to, not "
                  "the same as, those on the official files." for o in recoded]
        parts.append("")
    if skipped:
        parts += ["## Datasets skipped", ""]
        parts += [f"- **{o.name}**: {o.skipped}" for o in skipped]
        parts.append("")
    if done:
        parts += [_paper_section(done), ""]
        parts += [_dataset_section(o, out) for o in done]
        parts += ["## Configuration used", "",
                  "The base configuration of each dataset (seed 0, FedCure); every run changes "
                  "only the method preset, the seed, the formation rule or β as its label says.",
                  ""]
        for o in done:
            parts += [f"<details><summary>{o.name}</summary>", "", "```json",
                      json.dumps(o.config, indent=1), "```", "", "</details>", ""]
    path = out / "report.md"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))
    log.info("wrote %s", path)
    return path


__all__ = ["OurTable1", "ordering_line", "our_table1", "rank_order", "table1_comparison",
           "write_report"]
