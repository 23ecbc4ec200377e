"""The dip of the formed methods' curves: the largest fall of the test accuracy below its
running best (:func:`find_dip`), and what the records say about the rounds of the fall (test
loss, schedule, per-class accuracy, which classes the model predicts, how far each arriving edge
model sits from the global model), as numbers (:func:`dip_analysis`) and as the report's tables
and paragraph (:func:`dip_markdown`). Pure functions of run results, but for the class plot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.experiments.base import markdown_table
from fedcure_app.experiments.figures import line_plot
from fedcure_app.experiments.table1 import METHODS


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


def dip_data(dip: Dip | None) -> dict[str, Any] | None:
    """A :class:`Dip` as the summary's JSON (None stays None)."""
    if dip is None:
        return None
    return {"peak_round": dip.peak_round, "peak": dip.peak, "trough_round": dip.trough_round,
            "trough": dip.trough, "recovered_round": dip.recovered_round, "depth": dip.depth}


def has_diagnostics(result: dict[str, Any]) -> bool:
    """Whether ``result``'s records hold the per-class diagnostics (confusion counts)."""
    return any(r.get("confusion") is not None for r in result["records"])


def class_plot(result: dict[str, Any], path: Path, name: str) -> Path:
    """Test accuracy per class (and overall) against the global round, as a PNG at ``path``."""
    ev = [r for r in evaluations(result) if r.get("class_accuracy") is not None]
    series = {f"class {c}": [100 * r["class_accuracy"][c] for r in ev]
              for c in range(len(ev[0]["class_accuracy"]))}
    series["all"] = [100 * r["accuracy"] for r in ev]
    x = {k: [r["round"] for r in ev] for k in series}
    return line_plot(series, path, xlabel="global round", ylabel="test accuracy (%)",
                     title=f"{name}: FedCure seed 0, accuracy per class", x=x)
