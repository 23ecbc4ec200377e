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
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.experiments.base import Context, RunSpec, Section, markdown_table
from fedcure_app.experiments.figures import accuracy_curves, line_plot
from fedcure_app.experiments.paper import PAPER_TABLE1
from fedcure_app.experiments.runner import MissingRun
from fedcure_app.experiments.table1 import METHODS

NAME = "ablation"
TITLE = "What moves the accuracy: one change at a time (ablation)"

#: The record fields the literal run must hold for the dip analysis.
DIAGNOSTICS: tuple[str, ...] = ("confusion", "edge_distance", "train_loss_first")
#: The formed methods whose curves show the dip (Table 1's runs, where cached).
FORMED: tuple[str, ...] = ("fedgreedy", "fedfair", "fedcure")
#: Within this many points of the paper's FedCure accuracy a reading counts as reaching it.
WITHIN_POINTS = 1.0


@dataclass(frozen=True)
class Variant:
    """One run of the ablation: ``flat`` configuration overrides on the literal run.

    ``reading``: the change is a reading of something the paper leaves open (its optimiser,
    batch size, what τ_c counts), so it may stand as a second reading of the paper's setting;
    otherwise it departs from a value the paper gives (lr 0.01, ℓ, τ_c = 5) and only measures
    the sensitivity."""

    key: str
    label: str
    flat: Mapping[str, Any] = field(default_factory=dict)
    reading: bool = True


#: Cheapest first; the literal run first of all (the dip analysis needs its diagnostics).
VARIANTS: tuple[Variant, ...] = (
    Variant("literal", "literal (τ_c = 5 steps, batch 32, lr 0.01, ℓ = 0.2, plain SGD)"),
    Variant("batch10", "batch size 10", {"batch-size": 10}),
    Variant("momentum", "momentum 0.9", {"momentum": 0.9}),
    Variant("lr", "lr 0.05", {"lr": 0.05}, reading=False),
    Variant("ell", "ℓ = 0.5", {"ell": 0.5}, reading=False),
    Variant("batch64", "batch size 64", {"batch-size": 64}),
    Variant("tau10", "τ_c = 10 steps", {"tau-c": 10}, reading=False),
    Variant("epoch", "τ_c = 1 local epoch (⌈|D_n|/B⌉ steps)", {"tau-c": 1, "tau-c-unit": "epochs"}),
)
VARIANT_BY_KEY: dict[str, Variant] = {v.key: v for v in VARIANTS}


def variant_spec(ctx: Context, v: Variant) -> RunSpec:
    """The run of variant ``v`` (FedCure, seed 0); the literal one is Table 1's FedCure run."""
    if v.key == "literal":
        return ctx.spec(f"{ctx.name} {METHODS['fedcure']}", "fedcure", seed=0,
                        needs=DIAGNOSTICS)
    return ctx.spec(f"{ctx.name} FedCure ablation: {v.label}", "fedcure", seed=0, **v.flat)


def plan(ctx: Context, only: Sequence[str] | None = None) -> list[RunSpec]:
    """The runs of the variants named in ``only`` (every variant when None), in
    :data:`VARIANTS` order."""
    return [variant_spec(ctx, v) for v in VARIANTS if only is None or v.key in only]


def parse_variants(value: str) -> list[str]:
    """Variant keys from a comma-separated ``value`` ('all': every one), checked."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError("no ablation variant given")
    if names == ["all"]:
        return [v.key for v in VARIANTS]
    bad = [n for n in names if n not in VARIANT_BY_KEY]
    if bad:
        raise ValueError(f"unknown ablation variant {bad[0]!r}; choose from "
                         f"{', '.join(VARIANT_BY_KEY)} or all")
    return list(dict.fromkeys(names))


def paper_accuracy(dataset: str) -> float | None:
    """The paper's FedCure final accuracy (%) on ``dataset`` (Table 1), or None."""
    row = PAPER_TABLE1.accuracy.get(dataset)
    return None if row is None else float(row["fedcure"][0])


# ------------------------------------------------------------------ the dip

def evaluations(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of ``result`` that carry a test evaluation, in round order."""
    return [r for r in result["records"] if r.get("accuracy") is not None]


@dataclass(frozen=True)
class Dip:
    """The largest fall of the test accuracy below its running best (fractions; rounds are
    global rounds): from ``peak`` at ``peak_round`` down to ``trough`` at ``trough_round``, back
    at or above the peak at ``recovered_round`` (None: never); ``loss_rises``: evaluations
    between peak and trough whose test loss was above the previous one's, of ``steps``."""

    peak_round: int
    peak: float
    trough_round: int
    trough: float
    recovered_round: int | None
    loss_rises: int
    steps: int

    @property
    def depth(self) -> float:
        return self.peak - self.trough


def find_dip(result: dict[str, Any]) -> Dip | None:
    """The deepest fall below the running best accuracy of ``result`` (None if it never falls)."""
    ev = evaluations(result)
    best_i, depth, at = 0, 0.0, None
    for j, r in enumerate(ev):
        if r["accuracy"] > ev[best_i]["accuracy"]:
            best_i = j
        fall = ev[best_i]["accuracy"] - r["accuracy"]
        if fall > depth:
            depth, at = fall, (best_i, j)
    if at is None:
        return None
    i, j = at
    peak = ev[i]["accuracy"]
    rec = next((r["round"] for r in ev[j + 1:] if r["accuracy"] >= peak), None)
    losses = [r["loss"] for r in ev[i:j + 1]]
    rises = sum(1 for a, b in zip(losses, losses[1:]) if b > a)
    return Dip(ev[i]["round"], peak, ev[j]["round"], ev[j]["accuracy"], rec, rises,
               len(losses) - 1)


def _window(result: dict[str, Any], lo: int, hi: int) -> list[dict[str, Any]]:
    return [r for r in result["records"] if lo < r["round"] <= hi]


def schedule_in(records: Sequence[dict[str, Any]], num_edges: int) -> dict[str, Any]:
    """Mean staleness, mean ξ and each coalition's share of the arrivals in ``records``."""
    if not records:
        return {"arrivals": 0, "staleness": float("nan"), "xi": float("nan"),
                "share": [float("nan")] * num_edges}
    counts = np.bincount([int(r["coalition"]) for r in records], minlength=num_edges)
    return {"arrivals": len(records),
            "staleness": float(np.mean([r["staleness"] for r in records])),
            "xi": float(np.mean([r["xi"] for r in records])),
            "share": (counts / counts.sum()).tolist()}


def _mean_field(records: Sequence[dict[str, Any]], name: str) -> float | None:
    vals = [r[name] for r in records if r.get(name) is not None]
    return float(np.mean(vals)) if vals else None


def class_shift(result: dict[str, Any], dip: Dip) -> list[dict[str, Any]] | None:
    """Per class, from the dip's peak to its trough: the accuracy on that class's test samples
    (recall) and the share of all test samples predicted as it (None without confusion counts).
    """
    by_round = {r["round"]: r for r in evaluations(result)}
    a, b = by_round[dip.peak_round].get("confusion"), by_round[dip.trough_round].get("confusion")
    if a is None or b is None:
        return None
    ca, cb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    out = []
    for c in range(ca.shape[0]):
        out.append({
            "class": c,
            "recall_peak": float(ca[c, c] / max(1.0, ca[c].sum())),
            "recall_trough": float(cb[c, c] / max(1.0, cb[c].sum())),
            "predicted_peak": float(ca[:, c].sum() / max(1.0, ca.sum())),
            "predicted_trough": float(cb[:, c].sum() / max(1.0, cb.sum())),
            # where the class's samples went at the trough, beyond the peak's confusion
            "lost_to": int(np.argmax(np.where(np.arange(ca.shape[0]) == c, -np.inf,
                                              cb[c] - ca[c]))),
        })
    return out


def dip_analysis(formed: Mapping[str, Sequence[dict[str, Any]]], literal: dict[str, Any] | None,
                 num_edges: int) -> dict[str, Any]:
    """The numbers behind the dip: per formed run its :class:`Dip`; for the literal run (when
    it has the diagnostics) the schedule, training losses and edge distances before, during and
    after the fall, and the per-class shift."""
    runs = []
    for m, results in formed.items():
        for r in results:
            d = find_dip(r)
            if d is not None:
                runs.append({"method": m, "seed": int(r["config"]["run"]["seed"]),
                             **d.__dict__, "depth": d.depth})
    out: dict[str, Any] = {"runs": runs}
    if literal is None:
        return out
    d = find_dip(literal)
    if d is None:
        return out
    before = _window(literal, 0, d.peak_round)
    during = _window(literal, d.peak_round, d.trough_round)
    after = _window(literal, d.trough_round, literal["rounds"])
    out["literal"] = {
        "dip": {**d.__dict__, "depth": d.depth},
        "schedule": {k: schedule_in(v, num_edges)
                     for k, v in (("before", before), ("during", during), ("after", after))},
        "edge_distance": {k: _mean_field(v, "edge_distance")
                          for k, v in (("before", before), ("during", during), ("after", after))},
        "train_loss_first": {k: _mean_field(v, "train_loss_first")
                             for k, v in (("before", before), ("during", during),
                                          ("after", after))},
        "train_loss_last": {k: _mean_field(v, "train_loss_last")
                            for k, v in (("before", before), ("during", during),
                                         ("after", after))},
        "classes": class_shift(literal, d),
        "lr": float(literal["config"]["method"]["lr"]),
        "formed_jsd": literal.get("formed_jsd"),
    }
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}"


def dip_markdown(data: dict[str, Any]) -> str:
    """The dip's tables and the explanation the measurements support."""
    runs = data["runs"]
    if not runs:
        return "No formed run is in the cache, so the dip cannot be measured here."
    rows = [[METHODS[r["method"]], str(r["seed"]), f"{r['peak_round']}", _pct(r["peak"]),
             f"{r['trough_round']}", _pct(r["trough"]), f"{100 * r['depth']:.2f}",
             str(r["recovered_round"]) if r["recovered_round"] is not None else "never",
             f"{r['loss_rises']} of {r['steps']}"]
            for r in runs]
    md = [markdown_table(["method", "seed", "peak round", "peak (%)", "trough round",
                          "trough (%)", "fall (points)", "back at the peak by round",
                          "test-loss rises during the fall"], rows)]
    rises = sum(r["loss_rises"] for r in runs)
    steps = sum(r["steps"] for r in runs)
    md += ["", f"Over the {len(runs)} formed runs the test loss rose in {rises} of the {steps} "
           "evaluation steps from peak to trough: the model's loss keeps falling while its "
           "accuracy falls."]
    lit = data.get("literal")
    if lit is None or lit.get("classes") is None:
        md += ["", "The literal run's records hold no per-class diagnostics yet; re-run "
               "`fedcure experiment ablation` to add them."]
        return "\n".join(md)
    d = lit["dip"]
    sch = lit["schedule"]
    srows = []
    for k in ("before", "during", "after"):
        s = sch[k]
        srows.append([k, str(s["arrivals"]), f"{s['staleness']:.2f}", f"{s['xi']:.3f}",
                      ", ".join(f"{x:.2f}" for x in s["share"]),
                      _num(lit["edge_distance"][k]), _num(lit["train_loss_first"][k]),
                      _num(lit["train_loss_last"][k])])
    md += ["", f"The literal run (FedCure, seed 0) peaks at {_pct(d['peak'])} % (round "
           f"{d['peak_round']}) and falls to {_pct(d['trough'])} % (round {d['trough_round']}). "
           "Its arrivals before, during and after that fall:", "",
           markdown_table(["rounds", "arrivals", "mean staleness φ", "mean ξ",
                           "share of arrivals per coalition", "‖edge − global‖ (L2)",
                           "clients' training loss, first edge round",
                           "clients' training loss, last edge round"], srows)]
    classes = lit["classes"]
    crows = [[str(c["class"]), _pct(c["recall_peak"]), _pct(c["recall_trough"]),
              f"{100 * (c['recall_trough'] - c['recall_peak']):+.1f}",
              _pct(c["predicted_peak"]), _pct(c["predicted_trough"]), str(c["lost_to"])]
             for c in classes]
    md += ["", "Per class, at the peak and at the trough (recall: accuracy on that class's test "
           "samples; predicted: share of all test samples the model assigns to it; lost to: "
           "the class that gained most of its samples):", "",
           markdown_table(["class", "recall at peak (%)", "recall at trough (%)",
                           "change (points)", "predicted at peak (%)",
                           "predicted at trough (%)", "lost to"], crows)]
    md += ["", dip_explanation(data)]
    return "\n".join(md)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def dip_explanation(data: dict[str, Any]) -> str:
    """What the measurements say about the dip (a paragraph built from the numbers: each claim
    is made only where the numbers support it)."""
    lit = data["literal"]
    d, sch, classes = lit["dip"], lit["schedule"], lit["classes"]
    runs = data["runs"]
    text = [f"In the literal run the accuracy falls {100 * d['depth']:.1f} points between "
            f"rounds {d['peak_round']} and {d['trough_round']}."]
    rises = sum(r["loss_rises"] for r in runs)
    if rises == 0:
        text.append(f"In none of the {len(runs)} formed runs does the test loss rise while the "
                    "accuracy falls: the model is not diverging; it keeps lowering its mean "
                    "loss while fewer of its argmax predictions are right.")
    b, du = sch["before"], sch["during"]
    share_shift = max(abs(x - y) for x, y in zip(b["share"], du["share"]))
    if (abs(du["staleness"] - b["staleness"]) < 0.5 and abs(du["xi"] - b["xi"]) < 0.01
            and share_shift <= 0.1):
        text.append(f"What reaches the cloud does not change when the fall starts: mean "
                    f"staleness {b['staleness']:.2f} before and {du['staleness']:.2f} during, "
                    f"mean ξ {b['xi']:.3f} and {du['xi']:.3f}, each coalition's share of the "
                    f"arrivals within {share_shift:.2f} of its earlier one, and the learning "
                    f"rate is constant ({lit['lr']:g}; no schedule).")
    else:
        text.append(f"The schedule shifts with the fall: mean staleness {b['staleness']:.2f} → "
                    f"{du['staleness']:.2f}, mean ξ {b['xi']:.3f} → {du['xi']:.3f}, coalition "
                    f"shares move by up to {share_shift:.2f}.")
    jsd = lit.get("formed_jsd")
    if jsd is not None and jsd < 0.01:
        text.append(f"After formation the coalitions' label mixes are the same (JSD {jsd:.4f} "
                    "nats), so which coalition arrives cannot tilt the model toward some "
                    "classes.")
    dist = lit["edge_distance"]
    if dist["before"] and dist["during"]:
        ratio = dist["during"] / dist["before"]
        text.append(f"The arriving edge models sit {dist['during']:.3f} (L2) from the global "
                    f"model during the fall against {dist['before']:.3f} before (×{ratio:.2f}); "
                    "the clients' training loss in a task's first edge round goes from "
                    f"{_num(lit['train_loss_first']['before'])} to "
                    f"{_num(lit['train_loss_first']['during'])}.")
    drops = sorted(classes, key=lambda c: c["recall_trough"] - c["recall_peak"])
    lost = sum(max(0.0, c["recall_peak"] - c["recall_trough"]) for c in classes)
    top = [c for c in drops if c["recall_peak"] - c["recall_trough"] > 0.02][:3]
    if top and lost > 0:
        share = sum(c["recall_peak"] - c["recall_trough"] for c in top) / lost
        names = ", ".join(f"{c['class']} ({100 * (c['recall_peak'] - c['recall_trough']):.1f} "
                          f"points, mostly to {c['lost_to']})" for c in top)
        text.append(f"The lost accuracy is {'concentrated' if share >= 0.6 else 'spread'}: "
                    f"classes {names} carry {100 * share:.0f} % of the summed per-class "
                    "recall lost.")
    gained = [c for c in classes if c["predicted_trough"] - c["predicted_peak"] > 0.01]
    if gained:
        text.append("At the trough the model assigns more of the test set to "
                    + ", ".join(f"class {c['class']} ({_pct(c['predicted_peak'])} → "
                                f"{_pct(c['predicted_trough'])} %)" for c in gained) + ".")
    return " ".join(text)


# ------------------------------------------------------------------ the section

def _curve(result: dict[str, Any]) -> list[list[float]]:
    return [[r["round"], r["accuracy"]] for r in evaluations(result)]


def regenerate_command(ctx: Context) -> str:
    """The command that rewrites this section from its cache (``DIR``: the data folder); it
    simulates nothing (``--cache-only``: variants not cached stay "not run yet")."""
    out = ctx.out_dir.parent
    return (f"fedcure experiment ablation --dataset {ctx.name} --budget {ctx.budget.name} "
            f"--out {out.as_posix()} --data-dir DIR --cache-only")


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
                           "dip": _dip_data(find_dip(r)),
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
    formed = {m: [r for r in (ctx.runner.peek(s) for s in _formed_specs(ctx, m))
                  if r is not None] for m in FORMED}
    dip = dip_analysis(formed, lit if lit is not None and _has_diag(lit) else None,
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
        figures.append(_class_plot(lit, folder / "dip_classes.png", ctx.name))
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


def _dip_data(dip: Dip | None) -> dict[str, Any] | None:
    if dip is None:
        return None
    return {"peak_round": dip.peak_round, "peak": dip.peak, "trough_round": dip.trough_round,
            "trough": dip.trough, "recovered_round": dip.recovered_round, "depth": dip.depth}


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


def _formed_specs(ctx: Context, method: str) -> list[RunSpec]:
    return [ctx.spec(f"{ctx.name} {METHODS[method]}", method, seed=s) for s in ctx.seeds()]


def _has_diag(result: dict[str, Any]) -> bool:
    return any(r.get("confusion") is not None for r in result["records"])


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


def second_reading_specs(ctx: Context, v: Variant, method: str) -> list[RunSpec]:
    """Table 1's runs of ``method`` (every seed) at reading ``v``."""
    return [ctx.spec(f"{ctx.name} {METHODS[method]} ({v.label})", method, seed=s, **v.flat)
            for s in ctx.seeds()]


def second_reading_section(ctx: Context, v: Variant, paper: float, folder: Path
                           ) -> tuple[str, dict[str, Any], Path | None]:
    """Table 1's formed methods at reading ``v`` beside the literal reading and the paper
    (runs missing under ``--cache-only`` are listed as not run yet)."""
    rows, data, curves = [], {}, {}
    for m in FORMED:
        lit = [r for r in (ctx.runner.peek(s) for s in _formed_specs(ctx, m)) if r is not None]
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


def _class_plot(result: dict[str, Any], path: Path, name: str) -> Path:
    ev = [r for r in evaluations(result) if r.get("class_accuracy") is not None]
    series = {f"class {c}": [100 * r["class_accuracy"][c] for r in ev]
              for c in range(len(ev[0]["class_accuracy"]))}
    series["all"] = [100 * r["accuracy"] for r in ev]
    x = {k: [r["round"] for r in ev] for k in series}
    return line_plot(series, path, xlabel="global round", ylabel="test accuracy (%)",
                     title=f"{name}: FedCure seed 0, accuracy per class", x=x)


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
