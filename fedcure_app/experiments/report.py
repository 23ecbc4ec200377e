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
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from fedcure_app.experiments.base import markdown_table
from fedcure_app.experiments.paper import PAPER, TABLE1_MISSING
from fedcure_app.experiments.stats import fmt_d, fmt_mean_std, mean_std
from fedcure_app.experiments.suite import REPORT_ORDER, DatasetOutcome
from fedcure_app.experiments.table1 import METHODS

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


def _table1_combined(done: Sequence[DatasetOutcome]) -> str:
    have = [o for o in done if "table1" in o.sections]
    if not have:
        return "_Table 1 was not run._"
    rows = []
    for m, name in METHODS.items():
        row = [name]
        for o in have:
            mu, sd = mean_std(o.sections["table1"].data["final_accuracy"][m])
            row.append(fmt_mean_std(mu, sd))
        rows.append(row)
    drow = ["Cohen's d (FedCure vs FedFair)"]
    for o in have:
        d = o.sections["table1"].data["cohens_d_fedcure_vs_fedfair"]
        drow.append(fmt_d(d) if d is not None else "n/a")
    rows.append(drow)
    return markdown_table(["method"] + [f"{o.name} (ours)" for o in have], rows)


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
    for o in done:
        e = o.sections.get("efficiency")
        if e is None:
            continue
        covs = {m: float(np.mean(v)) for m, v in e.data["latency_cov"].items()}
        lowest = min(covs, key=covs.get)
        ours = covs["fedcure"]
        why = (f"Lowest here: {METHODS[lowest]} ({covs[lowest]:.4f}). Our latencies are drawn "
               "from simulated device profiles with lognormal jitter, each coalition task being "
               "τ_e = 12 edge rounds as slow as the coalition's slowest client; the paper measured "
               "its own testbed. The COV mostly reflects how far apart the coalitions' slowest "
               "devices are, which depends on the device mix, not on the method alone.")
        rows.append([f"latency COV of FedCure ({o.name})", f"{pc.value:.4f} (lowest of all)",
                     f"{ours:.4f}", f"×{ours / pc.value:.1f}", why])
    pr = PAPER["max_accuracy_ratio"]
    best = None
    for o in done:
        t = o.sections.get("table1")
        if t is None:
            continue
        acc = {m: float(np.mean(v)) for m, v in t.data["final_accuracy"].items()}
        worst = min((m for m in acc if m != "fedcure"), key=acc.get)
        ratio = acc["fedcure"] / max(acc[worst], 1e-9)
        if best is None or ratio > best[0]:
            best = (ratio, o.name, worst)
    for o in done:
        t = o.sections.get("table1")
        if t is None:
            continue
        acc = {m: float(np.mean(v)) for m, v in t.data["final_accuracy"].items()}
        runner_up = max((m for m in acc if m != "fedcure"), key=acc.get)
        margin = 100 * (acc["fedcure"] - acc[runner_up])
        d = t.data["cohens_d_fedcure_vs_fedfair"]
        rows.append([f"FedCure most accurate of the five ({o.name})",
                     "yes (it improves on all four baselines)",
                     f"{'yes' if margin > 0 else 'no'}: {margin:+.2f} points over "
                     f"{METHODS[runner_up]}",
                     f"Cohen's d vs FedFair {fmt_d(d) if d is not None else 'n/a'}",
                     "The big step comes from formation (Fed- variants vs plain); among the "
                     "three formed variants the scheduler decides the rest, and short runs with "
                     "few seeds leave that gap within the seed-to-seed spread (see the std)."])
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


def _paper_section(done: Sequence[DatasetOutcome]) -> str:
    parts = ["## Our numbers next to the paper's", "",
             "### Table 1 — final test accuracy (%), edge non-IID, mean ± std over seeds", "",
             _table1_combined(done), "", TABLE1_MISSING, "", "### The paper's headline claims",
             ""]
    rows = _gap_rows(done)
    if rows:
        parts.append(markdown_table(["claim", "paper", "ours", "difference", "why we think so"],
                                    rows))
    sources = sorted({p.source for p in PAPER.values()})
    parts += ["", "Sources: " + "; ".join(sources) + ".", "",
              "General reasons our accuracies sit below a full-length run: below the paper "
              "budget we train for far fewer global rounds and edge rounds than the paper (see "
              "the budget table) and compensate only partly with a larger learning rate; "
              "devices and "
              "latencies are simulated; digits is scikit-learn's 8×8 digits set (1,437 training "
              "images), not one of the paper's datasets."]
    return "\n".join(parts)


def _dataset_section(o: DatasetOutcome, out: Path) -> str:
    lines = [f"## {o.name}", ""]
    for exp in REPORT_ORDER:
        s = o.sections.get(exp)
        if s is None:
            continue
        lines += [f"### {s.title}", "", s.markdown, ""]
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
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [
        "# FedCure — reproducing the paper", "",
        f"Generated by `{command}` on {now}: {_minutes(total_seconds)} of wall time on "
        f"{cores} CPU core(s) ({platform.processor() or platform.machine()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, "
        f"{threads or torch.get_num_threads()} torch thread(s). Every figure below is a PNG "
        "next to this file; raw numbers are in each experiment's `summary.json`. Runs already "
        "in the cache (`<dataset>/runs/`) are not simulated again; the simulation-time column "
        "sums each run's own wall time as measured when it ran. The machine was shared with "
        f"other jobs (1-minute load average {os.getloadavg()[0]:.1f} when this was written), "
        "so times are upper bounds for an idle machine.", "",
        "## Budget", "", _budget_table(outcomes), "",
        "Everything not in the table keeps the paper's defaults: edge non-IID partition "
        "(2 classes per ES), ℓ = 0.2, k = 0.95, β = 0.5, K = ⌈M/2⌉ coalitions training at "
        "once, batch 32. The paper's setting is `--budget paper` (τ_c = 5, τ_e = 12, "
        "100–200 global rounds, lr 0.01, 0.005 for SVHN, 5 seeds). Accuracy is measured on "
        "the listed number of test samples (a fixed seeded subset where smaller than the test "
        "split). Schedule-only runs (Fig. 4) replay the scheduler and the simulated clock "
        "without training: latencies and queues do not depend on the model.", "",
    ]
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


__all__ = ["write_report"]
