"""What separates our accuracy from the paper's: FedCure (seed 0) at the budget, changing one
thing at a time against the literal reading, and the dip of the formed methods' curves.

The literal run is Table 1's FedCure seed-0 run (same configuration, so the same cache key); it
is simulated again once when its cached records lack the per-class diagnostics (confusion counts
at every evaluation), and the new result is checked against the cached one
(:func:`fedcure_app.experiments.runner.rerun_check`). Each variant changes one knob
(:data:`VARIANTS`, cheapest first; the local-epoch reading costs about |D_n|/(τ_c·B) times a
literal run, so it runs last).

The dip (:func:`find_dip`): the largest fall of the test accuracy below its running best, with
what the records say about the rounds of the fall (test loss, schedule, per-class accuracy,
which classes the model predicts, how far each arriving edge model sits from the global model).

The experiment's runs are in :mod:`fedcure_app.experiments.ablation_runs`, the dip's measures in
:mod:`fedcure_app.experiments.ablation_dip`; this module reads the runs and writes the section.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.experiments.ablation_dip import (
    Dip, class_plot, class_shift, dip_analysis, dip_data, dip_explanation, dip_markdown,
    evaluations, find_dip, has_diagnostics)
from fedcure_app.experiments.ablation_runs import (
    DIAGNOSTICS, FORMED, VARIANT_BY_KEY, VARIANTS, Variant, formed_specs, parse_variants, plan,
    regenerate_command, second_reading_specs, variant_spec)
from fedcure_app.experiments.base import Context, Section, markdown_table
from fedcure_app.experiments.figures import accuracy_curves
from fedcure_app.experiments.paper import PAPER_TABLE1
from fedcure_app.experiments.runner import MissingRun
from fedcure_app.experiments.table1 import METHODS

NAME = "ablation"
TITLE = "What moves the accuracy: one change at a time (ablation)"
#: Within this many points of the paper's FedCure accuracy a reading counts as reaching it.
WITHIN_POINTS = 1.0


def paper_accuracy(dataset: str) -> float | None:
    """The paper's FedCure final accuracy (%) on ``dataset`` (Table 1), or None."""
    row = PAPER_TABLE1.accuracy.get(dataset)
    return None if row is None else float(row["fedcure"][0])


def _curve(result: dict[str, Any]) -> list[list[float]]:
    return [[r["round"], r["accuracy"]] for r in evaluations(result)]


def analyse(ctx: Context) -> Section:
    folder = ctx.folder(NAME)
    paper = paper_accuracy(ctx.name)
    results: dict[str, dict[str, Any]] = {}
    pending: list[str] = []
    keys: dict[str, str] = {}
    for v in VARIANTS:
        spec = variant_spec(ctx, v)
        keys[v.key] = spec.key
        try:
            results[v.key] = ctx.runner.run_one(spec)
        except MissingRun:
            pending.append(v.key)
    labels = {v.key: v.label for v in VARIANTS}
    lit = results.get("literal")
    rows = []
    variants: dict[str, Any] = {}
    for v in VARIANTS:
        r = results.get(v.key)
        kind = "literal" if v.key == "literal" else ("reading" if v.reading else "departure")
        if r is None:
            rows.append([v.label, kind, "not run yet", "", "", "", "", ""])
            continue
        same = v.key != "literal" and keys[v.key] == keys["literal"]
        fin, best = float(r["final_accuracy"]), float(r["best_accuracy"])
        diff = "" if lit is None or v.key == "literal" else \
            f"{100 * (fin - float(lit['final_accuracy'])):+.2f}"
        rows.append([v.label + (" (= literal at this budget)" if same else ""), kind,
                     f"{100 * fin:.2f}", f"{100 * best:.2f}", diff,
                     f"{100 * fin - paper:+.2f}" if paper is not None else "n/a",
                     wall_cell(r), f"{r['simulated_seconds']:.0f}"])
        variants[v.key] = {"label": v.label, "overrides": dict(v.flat), "key": keys[v.key],
                           "reading": v.reading,
                           "final_accuracy": fin, "best_accuracy": best,
                           "wall_seconds": float(r["wall_seconds"]),
                           "device": r.get("device", "cpu"),
                           "dip": dip_data(find_dip(r)),
                           "simulated_seconds": float(r["simulated_seconds"]),
                           "curve": _curve(r)}
        if "rerun_check" in r:
            variants[v.key]["rerun_check"] = r["rerun_check"]
    md = [markdown_table(["variant", "kind", "final accuracy (%)", "best accuracy (%)",
                          "final − literal (points)",
                          "final − paper's FedCure (points)" if paper is not None else "paper",
                          "run wall time (s)", "simulated time (s)"], rows)]
    b = ctx.budget
    md += ["", f"FedCure, seed 0, {b.clients} clients / {b.edges} ESs, τ_e = {b.tau_e}, "
           f"{b.rounds} global rounds ({b.name} budget); each variant changes one knob of the "
           f"literal run (τ_c = {b.tau_c} mini-batch steps of 32 samples, lr {b.lr:g}, ℓ = 0.2, "
           "plain SGD). Momentum, where set, restarts with every edge round's fresh optimiser. "
           "Kind: a *reading* settles something the paper leaves open (its optimiser, batch "
           "size, what τ_c counts); a *departure* changes a value the paper gives (lr 0.01, "
           "ℓ, τ_c = 5) and only measures how much the accuracy depends on it."
           + (f" The paper's FedCure: {paper:.2f} %." if paper is not None else "")]
    if lit is not None and "rerun_check" in lit:
        chk = lit["rerun_check"]
        md += ["", "The literal run was simulated again to record the per-class diagnostics: "
               + ("it reproduced the cached run exactly (every arrival and evaluation)."
                  if chk["identical"] else
                  f"its evaluations differ from the cached run's by up to "
                  f"{100 * (chk['max_accuracy_difference'] or 0):.2f} points "
                  f"(same schedule: {'yes' if chk['same_schedule'] else 'no'}).")]
    dips = variant_dips(variants)
    if dips:
        md += ["", dips]
    verdict = reading_verdict(variants, paper)
    if verdict:
        md += ["", verdict]
    second = second_reading(variants, paper)
    if pending:
        md += ["", "Not run yet: " + ", ".join(labels[k] for k in pending) + "."]
    figures = []
    if results:
        figures.append(accuracy_curves(
            {labels[k]: [r] for k, r in results.items()}, folder / "accuracy.png",
            title=f"{ctx.name}: FedCure seed 0, one change at a time",
            reference=(paper, f"paper, FedCure ({paper:.2f} %)") if paper is not None else None,
            size=(7.5, 4.8)))
    formed = {m: [r for r in (ctx.runner.peek(s) for s in formed_specs(ctx, m))
                  if r is not None] for m in FORMED}
    dip = dip_analysis(formed, lit if lit is not None and has_diagnostics(lit) else None,
                       b.edges)
    second_data: dict[str, Any] = {}
    if second is not None:
        sec_md, second_data, fig = second_reading_section(ctx, VARIANT_BY_KEY[second], paper,
                                                          folder)
        md += ["", sec_md]
        if fig is not None:
            figures.append(fig)
    md += ["", "#### The dip of the formed methods", "", dip_markdown(dip)]
    if dip.get("literal", {}).get("classes"):
        figures.append(class_plot(lit, folder / "dip_classes.png", ctx.name))
    md += ["", f"Regenerate from the cache: `{regenerate_command(ctx)}` (DIR holds "
           f"{ctx.name}/raw; without `--cache-only` it simulates the variants not run yet, "
           "one at a time, or those named by `--variants`)."]
    data = {"budget": b.name, "dataset": ctx.name, "paper_fedcure_final": paper,
            "variants": variants, "pending": pending, "dip": dip,
            "second_reading": second_data,
            "command": regenerate_command(ctx)}
    section = Section(NAME, TITLE, ctx.name, "\n".join(md), figures, data)
    write_own_report(section, folder)
    return section


def wall_cell(result: Mapping[str, Any]) -> str:
    """A run's wall time (s), with the device it trained on where that was not the CPU."""
    dev = str(result.get("device", "cpu"))
    return f"{result['wall_seconds']:.0f}" + ("" if dev == "cpu" else f" ({dev})")


def variant_dips(variants: Mapping[str, Mapping[str, Any]]) -> str:
    """One line on each variant's deepest fall below its running best (the literal run's dip
    at rounds 25-45, and whether a change removes it)."""
    parts = []
    for key, v in variants.items():
        d = v.get("dip")
        if d is None:
            parts.append(f"{v['label']}: never falls")
        else:
            parts.append(f"{v['label']}: {100 * d['depth']:.2f} points, round "
                         f"{d['peak_round']} → {d['trough_round']}")
    if not parts:
        return ""
    return ("Deepest fall of each variant's curve below its running best: "
            + "; ".join(parts) + ".")


def reading_verdict(variants: Mapping[str, Mapping[str, Any]], paper: float | None) -> str:
    """Which readings reach the paper's accuracy (within :data:`WITHIN_POINTS`), and how much
    each change moves the final accuracy against the literal run."""
    if paper is None or "literal" not in variants or len(variants) < 2:
        return ""
    lit = 100 * variants["literal"]["final_accuracy"]
    others = {k: 100 * v["final_accuracy"] for k, v in variants.items() if k != "literal"}
    moves = sorted(others, key=lambda k: -(others[k] - lit))
    effect = ("Change of the final accuracy against the literal run's "
              f"{lit:.2f} % (points): "
              + "; ".join(f"{variants[k]['label']} {others[k] - lit:+.2f}" for k in moves) + ".")
    close = [k for k in moves if variants[k]["reading"] and others[k] >= paper - WITHIN_POINTS]
    near = [k for k in moves if not variants[k]["reading"] and others[k] >= paper - WITHIN_POINTS]
    if close:
        text = (f"Within {WITHIN_POINTS:g} point of the paper's {paper:.2f} %: "
                + ", ".join(f"{variants[k]['label']} ({others[k]:.2f} %)" for k in close) + ". ")
    else:
        text = (f"No reading of what the paper leaves open reaches its {paper:.2f} % within "
                f"{WITHIN_POINTS:g} point at this budget. ")
    if near:
        text += ("Departing from the paper's own values also gets there: "
                 + ", ".join(f"{variants[k]['label']} ({others[k]:.2f} %)" for k in near) + ". ")
    return text + effect


def second_reading(variants: Mapping[str, Mapping[str, Any]], paper: float | None) -> str | None:
    """The reading Table 1's formed methods are run again with: of the readings within
    :data:`WITHIN_POINTS` of the paper, the one whose run took the least wall time (None if
    none qualifies)."""
    if paper is None:
        return None
    ok = [k for k, v in variants.items() if k != "literal" and v["reading"]
          and 100 * v["final_accuracy"] >= paper - WITHIN_POINTS]
    return min(ok, key=lambda k: variants[k]["wall_seconds"]) if ok else None


def second_reading_section(ctx: Context, v: Variant, paper: float, folder: Path
                           ) -> tuple[str, dict[str, Any], Path | None]:
    """Table 1's formed methods at reading ``v`` beside the literal reading and the paper
    (runs missing under ``--cache-only`` are listed as not run yet)."""
    rows, data, curves = [], {}, {}
    for m in FORMED:
        lit = [r for r in (ctx.runner.peek(s) for s in formed_specs(ctx, m)) if r is not None]
        got, missing = [], 0
        for spec in second_reading_specs(ctx, v, m):
            try:
                got.append(ctx.runner.run_one(spec))
            except MissingRun:
                missing += 1
        p_mean, p_std = PAPER_TABLE1.accuracy[ctx.name][m]
        cell = (lambda rs: "not run" if not rs else
                f"{100 * np.mean([r['final_accuracy'] for r in rs]):.2f} ± "
                f"{100 * np.std([r['final_accuracy'] for r in rs], ddof=1) if len(rs) > 1 else 0:.2f}"
                f" ({len(rs)})")
        rows.append([METHODS[m], cell(lit), cell(got) + (f", {missing} not run yet"
                                                       if missing else ""),
                     f"{p_mean:.2f} ± {p_std:.2f}"])
        data[m] = {"literal": [r["final_accuracy"] for r in lit],
                   "second": [r["final_accuracy"] for r in got], "missing": missing}
        if lit:
            curves[f"{METHODS[m]}, literal"] = lit
        if got:
            curves[f"{METHODS[m]}, {v.label}"] = got
    md = (f"#### Table 1's formed methods at a second reading: {v.label}\n\n"
          + markdown_table(["method", "literal reading: final accuracy (%), seeds",
                            f"{v.label}: final accuracy (%), seeds", "paper (%)"], rows)
          + f"\n\nThe reading within {WITHIN_POINTS:g} point of the paper's FedCure that "
          "took the least time; mean ± sample std over the seeds in brackets, Table 1's "
          "budget otherwise. The literal reading stays the report's Table 1.")
    fig = None
    if curves:
        fig = accuracy_curves(curves, folder / "second_reading.png",
                              title=f"{ctx.name}: formed methods, literal vs {v.label}",
                              reference=(paper, f"paper, FedCure ({paper:.2f} %)"),
                              size=(7.5, 4.8))
    return md, {"variant": v.key, "label": v.label, "methods": data}, fig


def write_own_report(section: Section, folder: Path) -> Path:
    """``folder/report.md``: the section as a page of its own, figures beside it."""
    lines = [f"# {section.title} — {section.dataset}", "", section.markdown, ""]
    lines += [f"![{f.stem}]({f.name})" for f in section.figures]
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def load_summary(folder: Path) -> dict[str, Any] | None:
    """An earlier ablation's ``summary.json`` in ``folder`` (None if there is none)."""
    p = folder / "summary.json"
    if not p.is_file():
        return None
    return json.loads(p.read_text())


#: What the tests, the CLI and the suite use from the experiment, wherever it is defined.
__all__ = ["DIAGNOSTICS", "FORMED", "NAME", "TITLE", "VARIANTS", "VARIANT_BY_KEY", "WITHIN_POINTS",
           "Dip", "Variant", "analyse", "class_shift", "dip_analysis", "dip_explanation",
           "dip_markdown", "find_dip", "load_summary", "paper_accuracy", "parse_variants", "plan",
           "reading_verdict", "second_reading", "variant_dips", "wall_cell"]
