"""PNG plots of a run's per-round records: accuracy vs time, queues, participation.

Shared by every driver that writes a ``result.json``: ``fedcure simulate``, the Flower
ServerApp and the cloud server (whose ``time_s`` is wall time since round 0).

The time axis says which clock it shows: *simulated time* for a simulation, *wall-clock time
since round 0 was dispatched* for a deployment (``result["mode"] == "deployment"``). The
accuracy plot starts with the initial evaluation (``initial_accuracy``, at time 0), round axes
have whole-number ticks, legends sit outside the data, and titles spell out the dataset, the
formation rule and the scheduler (:func:`run_title`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

log = logging.getLogger(__name__)


#: x-axis label of each clock
CLOCK_LABELS: dict[str, str] = {
    "simulated": "simulated time (s)",
    "wall-clock": "wall-clock time since round 0 was dispatched (s)",
}


def clock_of(result: dict[str, Any]) -> str:
    """``"wall-clock"`` for a deployment's result, ``"simulated"`` otherwise."""
    return "wall-clock" if result.get("mode") == "deployment" else "simulated"


def run_title(result: dict[str, Any]) -> str:
    """``digits · formation: fedcure · scheduler: fedcure`` (what is known of the three)."""
    method = (result.get("config") or {}).get("method") or {}
    formation = (result.get("formation") or {}).get("rule") or method.get("formation")
    scheduler = method.get("scheduler") or result.get("scheduler")
    parts = [str(result["dataset"])] if result.get("dataset") else []
    if formation:
        parts.append(f"formation: {formation}")
    if scheduler:
        parts.append(f"scheduler: {scheduler}")
    return " · ".join(parts)


def _titled(ax: Any, what: str, title: str) -> None:
    ax.set_title(f"{what}\n{title}" if title else what, fontsize=10)


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, bbox_inches="tight")  # keeps a legend placed outside the axes
    plt.close(fig)
    return path


def plot_accuracy(records: list[dict[str, Any]], path: Path, title: str = "", *,
                  initial: float | None = None, clock: str = "simulated") -> Path:
    """Test accuracy (%) against time (s) on ``clock`` (``simulated`` or ``wall-clock``), from
    the initial evaluation (``initial``, a fraction, at time 0) and the evaluated rounds."""
    pts = [(r["time_s"], 100 * r["accuracy"]) for r in records if r.get("accuracy") is not None]
    if initial is not None:
        pts.insert(0, (0.0, 100 * initial))
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    if pts:
        t, a = zip(*pts)
        ax.plot(t, a, marker="o", ms=3, label="global model")
        if initial is not None:
            ax.plot([0.0], [100 * initial], marker="s", ms=6, ls="none", color="C3",
                    label="initial model (before round 1)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_xlabel(CLOCK_LABELS.get(clock, clock))
    ax.set_ylabel("test accuracy (%)")
    ax.set_xlim(left=0)
    _titled(ax, f"Test accuracy vs {'wall-clock' if clock == 'wall-clock' else 'simulated'}"
                " time", title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_queues(records: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Virtual-queue length Λ_m per coalition after each global round."""
    q = np.array([r["queues"] for r in records], dtype=float)
    rounds = [r["round"] for r in records]
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    if q.size:
        for m in range(q.shape[1]):
            ax.plot(rounds, q[:, m], label=f"coalition {m}", lw=1.2, marker="o", ms=2.5)
        if q.shape[1] <= 20:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0, ncol=1 if q.shape[1] <= 10 else 2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("global round")
    ax.set_ylabel(r"virtual queue $\Lambda_m$")
    _titled(ax, "Virtual queues", title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_participation(participation: dict[str, Any], path: Path, title: str = "") -> Path:
    """Each coalition's share of global rounds next to its target share δ_m."""
    share = np.asarray(participation["share"], dtype=float)
    delta = np.asarray(participation["delta"], dtype=float)
    x = np.arange(len(share))
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    ax.bar(x - 0.2, share, width=0.4, label="share of global rounds")
    ax.bar(x + 0.2, delta, width=0.4, label=r"target share $\delta_m$")
    ax.set_xticks(x)
    ax.set_xlabel("coalition")
    ax.set_ylabel("fraction of global rounds")
    _titled(ax, "Participation per coalition", title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def write_run_plots(result: dict[str, Any], out_dir: Path, title: str | None = None
                    ) -> list[Path]:
    """The three standard plots of a run into ``out_dir``; returns their paths.

    ``title``: the second title line of every plot (default :func:`run_title`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recs = result["records"]
    title = run_title(result) if title is None else title
    paths = [
        plot_accuracy(recs, out_dir / "accuracy.png", title,
                      initial=result.get("initial_accuracy"), clock=clock_of(result)),
        plot_queues(recs, out_dir / "queues.png", title),
        plot_participation(result["participation"], out_dir / "participation.png", title),
    ]
    log.info("plots written to %s", out_dir)
    return paths
