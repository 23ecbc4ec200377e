"""``fedcure experiment peers``: FedCure against FedAvg, HierFAVG, FedBuff and FedAT on the same
simulated devices, data, model and local optimiser, every method given the same simulated time
budget (``run.time-budget-s``) and evaluated at the same simulated instants
(``run.eval-every-s``).

Per setting it writes ``OUT/<setting>/peers/summary.json`` (``data.target_accuracy`` = 0.9 × the
best method's median final accuracy; per method and seed ``time_to_target_s``, ``final_accuracy``,
``accuracy_at_budget``, ``client_steps``, ``energy_j``, ``wan_bytes``), ``accuracy_time.png``
(median over seeds, min–max shaded) and a Markdown table; the runs are cached under
``OUT/<setting>/runs`` like every experiment's (:class:`~fedcure_app.experiments.runner.Runner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.experiments.base import Section, markdown_table
from fedcure_app.experiments.runner import MissingRun, Runner, RunSpec
from fedcure_app.testbed.peer_table import TARGET_FRACTION
from fedcure_app.testbed.peer_table import accuracy_at as last_accuracy_at
from fedcure_app.testbed.peer_table import time_to_target as first_at_target

NAME = "peers"
TITLE = "Against the peers: time to accuracy on the same simulated devices"

#: Display names, FedCure first.
METHODS: dict[str, str] = {"fedcure": "FedCure", "fedavg": "FedAvg", "hierfavg": "HierFAVG",
                           "fedbuff": "FedBuff", "fedat": "FedAT"}
#: FedCure with an option set (docs/benchmarks.md, "Against the peers": why): name -> (display
#: name, flat overrides; ``"M"`` stands for the setting's number of edges). Not in the target.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedcure-all": ("FedCure, K = M", {"method": "fedcure", "max-concurrent": "M"}),
    "fedcure-ell1": ("FedCure, ℓ = 1", {"method": "fedcure", "ell": 1.0}),
}
#: Evaluations per run: one every budget / this many simulated seconds.
EVALUATIONS = 20


def peer_specs(base: FedCureConfig, setting: str, seeds: int, budget_s: float,
               eval_samples: int | None, variants: bool = False) -> dict[str, list[RunSpec]]:
    """Per method (and with ``variants`` per :data:`VARIANTS` entry), one run per seed of
    ``base`` stopped at ``budget_s`` simulated seconds."""
    flat = {"global-rounds": 10_000_000, "time-budget-s": budget_s,
            "eval-every-s": budget_s / EVALUATIONS}
    runs = {m: (label, {"method": m}) for m, label in METHODS.items()}
    if variants:
        runs.update(VARIANTS)
    out: dict[str, list[RunSpec]] = {}
    for method, (label, over) in runs.items():
        over = {k: base.federation.num_edges if v == "M" else v for k, v in over.items()}
        cfg = apply_flat(base, {**over, **flat})
        out[method] = [RunSpec(f"{setting} {label} (seed {s})", apply_flat(cfg, {"seed": s}),
                               eval_samples=eval_samples) for s in range(seeds)]
    return out


def evaluations(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's records with the initial model's evaluation at 0 s first."""
    return [{"time_s": 0.0, "accuracy": result["initial_accuracy"]}, *result["records"]]


def time_to_target(result: dict[str, Any], target: float,
                   budget_s: float = float("inf")) -> float | None:
    """Simulated seconds of the first evaluation at or above ``target`` within ``budget_s``
    (None: never; the evaluation of the round that crosses the budget does not count), read
    as the testbed's table reads wall-clock runs (:mod:`fedcure_app.testbed.peer_table`)."""
    return first_at_target([r for r in evaluations(result) if float(r["time_s"]) <= budget_s],
                           target)


def accuracy_at(result: dict[str, Any], when_s: float) -> float:
    """Accuracy of the last evaluation at or before ``when_s`` simulated seconds."""
    found = last_accuracy_at(evaluations(result), when_s)
    assert found is not None  # the initial evaluation is at 0 s
    return found


def run_total(result: dict[str, Any], key: str) -> float:
    """A record field summed over the run (``client_steps``, ``wan_bytes``, ``energy_j``)."""
    return float(sum(r.get(key) or 0 for r in result["records"]))


def per_seed(results: Sequence[dict[str, Any]], target: float, budget_s: float
             ) -> dict[str, list[Any]]:
    """The summary's per-seed numbers of one method."""
    return {
        "time_to_target_s": [time_to_target(r, target, budget_s) for r in results],
        "final_accuracy": [float(r["final_accuracy"]) for r in results],
        "accuracy_at_budget": [accuracy_at(r, budget_s) for r in results],
        "client_steps": [int(run_total(r, "client_steps")) for r in results],
        "energy_j": [run_total(r, "energy_j") for r in results],
        "wan_bytes": [int(run_total(r, "wan_bytes")) for r in results],
        "simulated_seconds": [float(r["simulated_seconds"]) for r in results],
        "rounds": [int(r["rounds"]) for r in results],
    }


def median_time(times: Sequence[float | None]) -> float | None:
    """Median time to target over seeds, a seed that never reached it counted as infinitely
    late (None when the median itself never reached it)."""
    vals = np.array([np.inf if t is None else t for t in times], dtype=np.float64)
    med = float(np.median(vals))
    return None if not np.isfinite(med) else med


def speedups(data: dict[str, dict[str, list[Any]]], ours_key: str = "fedcure"
             ) -> dict[str, float | None]:
    """Median time to target of each peer over ``ours_key``'s (> 1: ours is sooner; None when
    either median never reached the target)."""
    ours = median_time(data[ours_key]["time_to_target_s"])
    out: dict[str, float | None] = {}
    for m in METHODS:
        if m == "fedcure" or m not in data:
            continue
        theirs = median_time(data[m]["time_to_target_s"])
        out[m] = None if ours is None or theirs is None or ours == 0 else theirs / ours
    return out


def curve_plot(runs: dict[str, list[dict[str, Any]]], path: Path, *, title: str,
               budget_s: float, target: float) -> Path:
    """Accuracy (%) against simulated time: per method the median of its seeds (each run's
    last evaluation held), the min–max over seeds shaded, the target dashed."""
    grid = np.linspace(0.0, budget_s, 200)
    fig = Figure(figsize=(6.6, 4.0), layout="constrained")
    ax = fig.subplots()
    for i, (method, results) in enumerate(runs.items()):
        ys = np.array([[100 * accuracy_at(r, t) for t in grid] for r in results])
        color = f"C{i}"
        label = METHODS.get(method) or VARIANTS[method][0]
        ax.plot(grid, np.median(ys, axis=0), color=color, lw=1.6, label=label,
                ls="--" if method in VARIANTS else "-")
        if len(results) > 1:
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=color, alpha=0.15)
    ax.axhline(100 * target, color="black", ls="--", lw=0.9, label="target")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path


def _fmt_time(t: float | None, budget_s: float) -> str:
    return f"> {budget_s:g}" if t is None else f"{t:.2f}"


def table(data: dict[str, dict[str, list[Any]]], budget_s: float) -> str:
    """The Markdown table: medians over seeds per method."""
    ups = speedups(data)
    rows = []
    names = {**METHODS, **{k: v[0] for k, v in VARIANTS.items()}}
    for m, name in ((m, n) for m, n in names.items() if m in data):
        d = data[m]
        reached = sum(t is not None for t in d["time_to_target_s"])
        ratio = "—" if m not in ups else ("n/a" if ups[m] is None else f"{ups[m]:.2f}×")
        rows.append([
            name, _fmt_time(median_time(d["time_to_target_s"]), budget_s),
            f"{reached}/{len(d['time_to_target_s'])}", ratio,
            f"{100 * float(np.median(d['final_accuracy'])):.2f}",
            f"{100 * float(np.median(d['accuracy_at_budget'])):.2f}",
            f"{float(np.median(d['client_steps'])):,.0f}",
            f"{float(np.median(d['energy_j'])):,.0f}",
            f"{float(np.median(d['wan_bytes'])) / 1e6:,.1f}", str(len(d["final_accuracy"])),
        ])
    return markdown_table(
        ["method", "time to target (s)", "seeds reaching it", "peer's time / FedCure's",
         "final accuracy (%)", "accuracy at budget (%)", "client steps", "energy (J)",
         "WAN (MB)", "seeds"], rows)


def analyse(setting: str, runs: dict[str, list[dict[str, Any]]], folder: Path,
            budget_s: float) -> Section:
    """The section of one setting from its runs (method → one result per seed)."""
    best = max(float(np.median([r["final_accuracy"] for r in runs[m]]))
               for m in METHODS if m in runs)
    target = TARGET_FRACTION * best
    data = {m: per_seed(rs, target, budget_s) for m, rs in runs.items()}
    fig = curve_plot(runs, folder / "accuracy_time.png", budget_s=budget_s, target=target,
                     title=f"{setting}: accuracy vs simulated time (median of "
                     f"{len(runs['fedcure'])} seeds, min–max shaded)")
    md = table(data, budget_s)
    md += (f"\n\nTarget {100 * target:.2f} % = {TARGET_FRACTION} × the best median final "
           f"accuracy; every method runs {budget_s:g} simulated seconds; medians over "
           f"the seeds run (a seed that never reaches the target counts as "
           "later than any that does)."
           + (f" Not run yet: {', '.join(METHODS[m] for m in METHODS if m not in runs)}."
              if any(m not in runs for m in METHODS) else ""))
    return Section(NAME, TITLE, setting, md, [fig], {
        "setting": setting, "target_accuracy": target, "budget_s": budget_s,
        "methods": data, "speedup_of_fedcure": speedups(data),
        **{f"speedup_of_{v}": speedups(data, v) for v in VARIANTS if v in data},
        "parameters": {m: runs[m][0]["config"].get("peers") for m in METHODS if m in runs},
        "not_run": [m for m in METHODS if m not in runs],
    })


def run_setting(setting: str, runner: Runner, base: FedCureConfig, out: Path, *, seeds: int,
                budget_s: float, eval_samples: int | None, variants: bool = False) -> Section:
    """Run (or read from the cache) every method's seeds of one setting (with ``variants``,
    FedCure's :data:`VARIANTS` too); write its section."""
    specs = peer_specs(base, setting, seeds, budget_s, eval_samples, variants)
    runner.run_all([s for ss in specs.values() for s in ss])
    # --cache-only: the seeds simulated so far (a method without any is left out)
    found = {m: [r for r in (runner.peek(s) for s in ss) if r is not None]
             for m, ss in specs.items()}
    runs = {m: rs for m, rs in found.items() if rs}
    if "fedcure" not in runs:
        raise MissingRun(f"{setting}: no FedCure run in the cache yet")
    folder = out / setting / NAME
    section = analyse(setting, runs, folder, budget_s)
    section.save(folder)
    (folder / "table.md").write_text(f"# {setting}: {TITLE}\n\n{section.markdown}\n")
    return section


__all__ = ["EVALUATIONS", "METHODS", "NAME", "TARGET_FRACTION", "TITLE", "VARIANTS", "accuracy_at",
           "analyse", "median_time", "peer_specs", "per_seed", "run_setting", "speedups",
           "time_to_target"]
