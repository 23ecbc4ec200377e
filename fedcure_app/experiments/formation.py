"""Fig. 2: coalition formation on the dataset's edge non-IID partition (no training).

- The main federation (50 clients, 5 ESs at the quick/paper budgets): the label distribution per
  coalition before formation, half-way through FedCure's accepted moves, and after, and the
  average pairwise JSD (nats) after every accepted move. The paper reports 0.69 → 0.
- The supplement's small federation (10 clients, 3 ESs): FedCure's coalition-friendly rule
  against the self-centred (RH-style) selfish rule, from the same initial partition.
"""

from __future__ import annotations

import numpy as np

from fedcure_app.federation import partition_for
from fedcure_app.config import apply_flat
from fedcure_app.core.coalition import form_coalitions
from fedcure_app.data.plot import plot_label_distribution
from fedcure_app.experiments.base import Context, RunSpec, Section, markdown_table
from fedcure_app.experiments.figures import line_plot

NAME = "formation"
TITLE = "Coalition formation (Fig. 2)"

#: The supplement's small federation.
SMALL_CLIENTS, SMALL_EDGES = 10, 3


def plan(ctx: Context) -> list[RunSpec]:
    """No simulations: formation runs on label counts only."""
    return []


def _replay(initial: np.ndarray, history: list[tuple[int, int, int]], moves: int) -> np.ndarray:
    """The assignment after the first ``moves`` accepted moves."""
    a = np.array(initial, dtype=np.int64, copy=True)
    for n, _b, to in history[:moves]:
        a[n] = to
    return a


def analyse(ctx: Context) -> Section:
    folder = ctx.folder(NAME)
    base = ctx.base()
    m = base.federation.num_edges
    part = partition_for(base, ctx.dataset)
    counts, initial = part.label_counts, part.initial_assignment
    main = form_coalitions(counts, initial, m, rule="fedcure", seed=base.run.seed)
    half = _replay(initial, main.history, main.moves // 2)
    n = base.federation.num_clients
    figures = []
    for tag, assign, what in (("before", initial, "before formation"),
                              ("during", half, f"after {main.moves // 2} of {main.moves} moves"),
                              ("after", main.assignment, "after formation (stable)")):
        figures.append(plot_label_distribution(
            counts, folder / f"labels_{tag}.png", assignment=assign, num_edges=m,
            title=f"{ctx.name}, {n} clients / {m} ESs, {what}"))

    small_cfg = apply_flat(base, {"num-clients": SMALL_CLIENTS, "num-edges": SMALL_EDGES})
    small = partition_for(small_cfg, ctx.dataset)
    rules = {}
    for rule in ("fedcure", "selfish"):
        rules[rule] = form_coalitions(small.label_counts, small.initial_assignment, SMALL_EDGES,
                                      rule=rule, seed=base.run.seed)
        figures.append(plot_label_distribution(
            small.label_counts, folder / f"labels_small_{rule}.png",
            assignment=rules[rule].assignment, num_edges=SMALL_EDGES,
            title=f"{ctx.name}, {SMALL_CLIENTS} clients / {SMALL_EDGES} ESs, {rule} rule"))
    figures.append(line_plot(
        {f"FedCure, {n}/{m}": main.jsd_trajectory,
         **{f"{'FedCure' if r == 'fedcure' else 'RH (selfish)'}, {SMALL_CLIENTS}/{SMALL_EDGES}":
            res.jsd_trajectory for r, res in rules.items()}},
        folder / "jsd_trajectory.png", xlabel="accepted moves",
        ylabel="average pairwise JSD (nats)",
        title=f"{ctx.name}: JSD during formation", drawstyle="steps-post"))

    rows = [[f"{n} / {m}", "FedCure", f"{main.initial_jsd:.4f}", f"{main.final_jsd:.4f}",
             str(main.moves), "yes" if main.stable else "no"]]
    for rule, res in rules.items():
        rows.append([f"{SMALL_CLIENTS} / {SMALL_EDGES}",
                     "FedCure" if rule == "fedcure" else "RH (selfish)",
                     f"{res.initial_jsd:.4f}", f"{res.final_jsd:.4f}", str(res.moves),
                     "yes" if res.stable else "no"])
    md = markdown_table(["clients / ESs", "rule", "JSD before", "JSD after", "moves", "stable"],
                        rows)
    data = {
        "main": {"clients": n, "edges": m, **{k: v for k, v in main.to_dict().items()
                                             if k != "history"}},
        "small": {r: {k: v for k, v in res.to_dict().items() if k != "history"}
                  for r, res in rules.items()},
    }
    return Section(NAME, TITLE, ctx.name, md, figures, data)
