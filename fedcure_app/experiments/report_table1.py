"""Table 1 in the report: our accuracies per reading beside the paper's, the differences, the
ordering checks and one line per method on what our runs show (``report.md``'s comparison)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedcure_app.experiments.base import Section, markdown_table
from fedcure_app.experiments.paper import PAPER_TABLE1, TABLE1_NOTE, PaperTable1
from fedcure_app.experiments.readings import LITERAL, READINGS
from fedcure_app.experiments.stats import fmt_d, mean_std
from fedcure_app.experiments.suite import DatasetOutcome
from fedcure_app.experiments.table1 import METHODS

FORMED: tuple[str, ...] = ("fedgreedy", "fedfair", "fedcure")
PLAIN: tuple[str, ...] = ("greedy", "fair")

def reading_sections(o: DatasetOutcome, experiment: str) -> list[tuple[str, Section]]:
    """(reading name, section) of ``experiment`` for every reading ``o`` holds, the literal
    reading first (:mod:`.readings`)."""
    return [(r.name, o.sections[r.folder(experiment)]) for r in READINGS.values()
            if r.folder(experiment) in o.sections]


def labelled(name: str, reading: str) -> str:
    """``name`` with the reading after it unless it is the literal one: ``mnist · momentum``."""
    return name if reading == LITERAL else f"{name} · {reading}"


@dataclass(frozen=True)
class OurTable1:
    """One dataset's Table 1 from our runs: (mean, std) of the final accuracy in % per method
    key of :data:`METHODS`, and Cohen's d of FedCure over FedFair (None with one seed)."""

    dataset: str
    accuracy: Mapping[str, tuple[float, float]]
    cohens_d: float | None
    #: the reading of the paper's setting the runs used (:mod:`.readings`)
    reading: str = LITERAL

    @property
    def label(self) -> str:
        """The dataset, with the reading unless it is the literal one."""
        return labelled(self.dataset, self.reading)


def our_table1(o: DatasetOutcome, reading: str = LITERAL) -> OurTable1 | None:
    """Our Table 1 for ``o`` under ``reading`` in percent, or None when it was not run."""
    t = o.sections.get(READINGS[reading].folder("table1"))
    if t is None:
        return None
    acc = {}
    for m in METHODS:
        mu, sd = mean_std(t.data["final_accuracy"][m])
        acc[m] = (100.0 * mu, 100.0 * sd)
    return OurTable1(o.name, acc, t.data["cohens_d_fedcure_vs_fedfair"], reading)


def our_tables1(o: DatasetOutcome) -> list[OurTable1]:
    """Our Table 1 for ``o`` under every reading it holds, the literal one first."""
    return [t for r in READINGS if (t := our_table1(o, r)) is not None]


def _pct(mean: float, std: float) -> str:
    """A mean ± std cell, already in percent."""
    return f"{mean:.2f} ± {std:.2f}"


def _d_diff(ours: float | None, paper: float) -> str:
    """|d ours| − d paper (the paper's d is unsigned), or n/a. No ``|`` in it: a table cell."""
    if ours is None or math.isinf(ours):
        return "n/a"
    return f"{abs(ours) - paper:+.2f} (magnitude)"


def _columns(t: OurTable1, paper: PaperTable1) -> list[tuple[str, list[str]]]:
    """One dataset's columns as (heading, cells: the five methods, then Cohen's d): ours, and
    where the paper reports the dataset, the paper's and ours − paper (points)."""
    d = fmt_d(t.cohens_d) if t.cohens_d is not None else "n/a"
    cols = [(f"{t.label} (ours)", [_pct(*t.accuracy[m]) for m in METHODS] + [d])]
    if t.dataset not in paper.accuracy:
        return cols
    p, pd = paper.accuracy[t.dataset], paper.cohens_d[t.dataset]
    cols.append((f"{paper.names[t.dataset]} (paper)",
                 [_pct(*p[m]) for m in METHODS] + [f"{pd:.2f}"]))
    cols.append((f"{t.label}: ours − paper",
                 [f"{t.accuracy[m][0] - p[m][0]:+.2f}" for m in METHODS]
                 + [_d_diff(t.cohens_d, pd)]))
    return cols


def table1_comparison(tables: Sequence[OurTable1], paper: PaperTable1 = PAPER_TABLE1) -> str:
    """Markdown table: one row per method (and Cohen's d), per dataset our column, then the
    paper's and the difference where the paper reports that dataset."""
    columns, shown = [], set()
    for t in tables:  # the paper's column once per dataset, after its first reading
        cols = _columns(t, paper)
        if t.dataset in shown and len(cols) == 3:
            cols = [cols[0], cols[2]]
        shown.add(t.dataset)
        columns += cols
    labels = list(METHODS.values()) + ["Cohen's d (FedCure vs FedFair)"]
    rows = [[label] + [cells[i] for _, cells in columns] for i, label in enumerate(labels)]
    return markdown_table(["method"] + [h for h, _ in columns], rows)


def rank_order(means: Mapping[str, float]) -> str:
    """``"FedFair = FedCure > FedGreedy > Fair > Greedy"``: methods by mean, best first."""
    ms = sorted(means, key=lambda m: -means[m])
    out = METHODS[ms[0]]
    for a, b in zip(ms, ms[1:]):
        out += f" {'=' if means[a] == means[b] else '>'} {METHODS[b]}"
    return out


def _above_plain(ours: Mapping[str, float]) -> str:
    """(a): each formed variant above both plain baselines: "holds" or the failing pairs."""
    fails = [f"{METHODS[m]} ≤ {METHODS[b]}" for m in FORMED for b in PLAIN
             if ours[m] <= ours[b]]
    return "holds" if not fails else f"does not hold ({', '.join(fails)})"


def _same_order(ours: Mapping[str, float], paper: Mapping[str, float]) -> str:
    """(b): every pair the paper orders strictly is ordered alike in ours: "holds" or the
    swapped (and tied) pairs, paper's higher one first."""
    swapped, tied = [], []
    for a in METHODS:
        for b in METHODS:
            if paper[a] > paper[b] and ours[a] <= ours[b]:
                (tied if ours[a] == ours[b] else swapped).append(f"{METHODS[a]}/{METHODS[b]}")
    if not swapped and not tied:
        return "holds"
    what = [f"swapped: {', '.join(swapped)}"] if swapped else []
    what += [f"tied in ours: {', '.join(tied)}"] if tied else []
    return f"does not hold ({'; '.join(what)})"


def ordering_line(dataset: str, ours: Mapping[str, float], paper: Mapping[str, float]) -> str:
    """One Markdown bullet: does the paper's ordering of the methods (mean accuracies, per
    method key) hold in ours — (a) formed variants above both plain ones, (b) the rank order."""
    return (f"- **{dataset}**: (a) FedGreedy, FedFair and FedCure each above both Greedy and "
            f"Fair: {_above_plain(ours)}. (b) the paper's rank order ({rank_order(paper)}): "
            f"{_same_order(ours, paper)}; ours: {rank_order(ours)}.")


def _table1_notes(tables: Sequence[OurTable1], paper: PaperTable1 = PAPER_TABLE1) -> list[str]:
    """Lines under the combined table: the ordering per reported dataset, then which datasets
    the paper has no column for and which of its columns we did not run."""
    means = {t.label: {m: mu for m, (mu, _) in t.accuracy.items()} for t in tables}
    dataset = {t.label: t.dataset for t in tables}
    lines = [ordering_line(label, ours, {m: mu for m, (mu, _) in
                                         paper.accuracy[dataset[label]].items()})
             for label, ours in means.items() if dataset[label] in paper.accuracy]
    if lines:
        lines = ["Does the paper's ordering hold in ours (mean final accuracy)?", ""] + lines
    for ds in dict.fromkeys(dataset.values()):
        if ds not in paper.accuracy:
            lines += ["", f"The paper has no {ds} column, so {ds} shows our numbers only."]
    missing = [paper.names[ds] for ds in paper.accuracy if ds not in dataset.values()]
    if missing:
        lines += ["", f"Not run here, so not shown: the paper's {', '.join(missing)} column(s)."]
    return lines


def _table1_combined(done: Sequence[DatasetOutcome]) -> str:
    """Our Table 1 next to the paper's, with the differences and the ordering checks."""
    tables = [t for o in done for t in our_tables1(o)]
    if not tables:
        return "_Table 1 was not run._"
    cells = [line for o in done for r in READINGS for line in table1_cell_notes(o, reading=r)]
    if cells:
        cells = ["", "Each difference, as our runs show it:", "", *cells]
    return "\n".join([table1_comparison(tables), "", TABLE1_NOTE, "", *_table1_notes(tables),
                      *cells])


def table1_cell_notes(o: DatasetOutcome, paper: PaperTable1 = PAPER_TABLE1, *,
                      reading: str = LITERAL) -> list[str]:
    """One line per method of a dataset the paper reports, under ``reading``: ours − paper and
    what our runs show about it (who participated, whether the accuracy was still rising at
    the end)."""
    t = o.sections.get(READINGS[reading].folder("table1"))
    if t is None or o.name not in paper.accuracy or "shares" not in t.data:
        return []
    k = t.data.get("max_concurrent")
    lines = []
    for m, name in METHODS.items():
        ours = 100.0 * float(np.mean(t.data["final_accuracy"][m]))
        diff = ours - paper.accuracy[o.name][m][0]
        shares = np.asarray(t.data["shares"][m], dtype=float)
        active = float(np.mean((shares >= 0.05).sum(axis=1)))
        gain = 100.0 * float(np.mean(t.data["late_gain"][m]))
        best = 100.0 * float(np.mean(t.data["best_accuracy"][m]))
        what = (f"{active:.0f} of {shares.shape[1]} coalitions had ≥ 5 % of the rounds "
                f"(K = {k} train at once); ")
        if m in ("greedy", "fedgreedy"):
            what += "the scheduler keeps taking the fastest available ones"
            what += (", so only their clients' classes shape the model (2 classes per "
                     "coalition before formation)" if m == "greedy" else
                     "; after formation each of them holds every class, so this costs little")
        else:
            what += "every coalition takes its data share"
            if m == "fair":
                what += (", but before formation each holds 2 classes and the global model "
                         "leans toward the last arrivals' classes")
        what += (f"; accuracy moved {gain:+.1f} points over the last tenth of the rounds "
                 f"(best {best:.2f} %).")
        lines.append(f"- **{labelled(o.name, reading)} {name}**: {ours:.2f} % vs the paper's "
                     f"{paper.accuracy[o.name][m][0]:.2f} % ({diff:+.2f}): {what}")
    return lines


__all__ = ["FORMED", "OurTable1", "PLAIN", "labelled", "ordering_line", "our_table1", "our_tables1", "rank_order", "reading_sections", "table1_cell_notes", "table1_comparison"]
