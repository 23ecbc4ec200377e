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


#: accuracy plots with at most this many points print each point's value beside it
LABEL_POINTS_MAX = 12
#: queue plots draw one panel per coalition up to this many coalitions, else one heat map
QUEUE_PANELS_MAX = 12
#: the queue plot's caption: what Λ_m is (fedcure_app.core.queues)
QUEUE_CAPTION = (
    r"$\Lambda_m$, coalition m's virtual queue, is its participation debt: it grows by its "
    r"target share $\delta_m$ every global round"
    "\nand drops by 1 in a round m is dispatched (never below 0). A queue that stays bounded "
    "means m gets at least"
    "\n" r"its share $\delta_m$ of the rounds; the scheduler favours coalitions with long "
    "queues.")


def drop_overlapping(fig: Any, texts: list[Any]) -> list[Any]:
    """Remove from ``fig`` every text of ``texts`` whose box overlaps one kept before it,
    the last text first (the final value is the one to read), then the others in order;
    returns the texts kept, in their order."""
    if not texts:
        return []
    renderer = fig.canvas.get_renderer()
    kept: list[Any] = []
    for text in [texts[-1], *texts[:-1]]:
        box = text.get_window_extent(renderer)
        if any(box.overlaps(k.get_window_extent(renderer)) for k in kept):
            text.remove()
        else:
            kept.append(text)
    return [t for t in texts if t in kept]


def plot_accuracy(records: list[dict[str, Any]], path: Path, title: str = "", *,
                  initial: float | None = None, clock: str = "simulated",
                  evaluation: str = "central") -> Path:
    """Test accuracy (%, axis 0–100) against time (s) on ``clock`` (``simulated`` or
    ``wall-clock``), from the initial evaluation (``initial``, a fraction, at time 0) and the
    evaluated rounds; with few points each is labelled with its value. ``evaluation``:
    ``federated`` names the accuracy the clients' (on their held-out parts)."""
    what = "federated accuracy" if evaluation == "federated" else "test accuracy"
    pts = [(r["time_s"], 100 * r["accuracy"], r.get("round"))
           for r in records if r.get("accuracy") is not None]
    if initial is not None:
        pts.insert(0, (0.0, 100 * initial, 0))
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    notes: list[Any] = []
    if pts:
        t, a, rounds = zip(*pts)
        few = len(pts) <= LABEL_POINTS_MAX
        ax.plot(t, a, marker="o", ms=6 if few else 3, label="global model")
        if initial is not None:
            ax.plot([0.0], [100 * initial], marker="s", ms=7, ls="none", color="C3",
                    label="initial model (before round 1)")
        if few:
            notes = [ax.annotate(f"{y:.1f} %" + (f"\nround {r}" if r else ""), (x, y),
                                 textcoords="offset points", xytext=(3, 6), ha="left",
                                 fontsize=7)
                     for x, y, r in zip(t, a, rounds)]
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_xlabel(CLOCK_LABELS.get(clock, clock))
    ax.set_ylabel(f"{what} (%)")
    ax.set_xlim(left=0)
    ax.set_ylim(0, 100)
    _titled(ax, f"{what.capitalize()} vs "
                f"{'wall-clock' if clock == 'wall-clock' else 'simulated'} time", title)
    ax.grid(alpha=0.3)
    drop_overlapping(fig, notes)  # once the axes' limits are final
    return _save(fig, path)


def plot_queues(records: list[dict[str, Any]], path: Path, title: str = "",
                delta: list[float] | None = None) -> Path:
    """Virtual-queue length Λ_m after each global round: one small panel per coalition (its
    target share δ_m in the panel, the rounds it was dispatched in marked below the curve),
    or a heat map beyond :data:`QUEUE_PANELS_MAX` coalitions; :data:`QUEUE_CAPTION` under it."""
    q = np.array([r["queues"] for r in records], dtype=float)
    rounds = [r["round"] for r in records]
    m_count = q.shape[1] if q.ndim == 2 else 0
    if 0 < m_count <= QUEUE_PANELS_MAX:
        fig, axes = plt.subplots(m_count, 1, sharex=True, dpi=120, squeeze=False,
                                 figsize=(6.5, 1.0 + 1.05 * m_count))
        axes = axes[:, 0]
        top = max(float(q.max()), 1e-9) * 1.15
        for m, ax in enumerate(axes):
            ax.plot(rounds, q[:, m], lw=1.2, marker="o", ms=2, color=f"C{m % 10}",
                    label=r"$\Lambda_m$ after the round")
            sent = [r["round"] for r in records if m in (r.get("dispatched") or [])]
            if sent:
                ax.plot(sent, [0.0] * len(sent), ls="none", marker="|", ms=7, color="k",
                        label="dispatched in this round")
            ax.set_ylim(-0.05 * top, top)
            share = "" if delta is None else rf", $\delta_{{{m}}}$ = {delta[m]:.2f}"
            ax.text(1.01, 0.5, f"coalition {m}{share}", transform=ax.transAxes, fontsize=7,
                    va="center")
            ax.set_ylabel(rf"$\Lambda_{{{m}}}$", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 1.0),
                       borderaxespad=0)
        ax = axes[-1]
    else:
        fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
        axes = [ax]
        if m_count:
            im = ax.imshow(q.T, aspect="auto", origin="lower", cmap="viridis",
                           extent=(rounds[0] - 0.5, rounds[-1] + 0.5, -0.5, m_count - 0.5))
            fig.colorbar(im, ax=ax, label=r"virtual queue $\Lambda_m$")
            ax.set_ylabel("coalition m")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("global round")
    _titled(axes[0], "Virtual queues", title)
    ax.annotate(QUEUE_CAPTION, xy=(-0.1, 0.0), xycoords=("axes fraction", ax.xaxis.label),
                xytext=(0, -6), textcoords="offset points", fontsize=7.5, va="top", ha="left")
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


#: the file names :func:`write_run_plots` writes
RUN_PLOTS: tuple[str, ...] = ("accuracy.png", "queues.png", "participation.png")


def write_run_plots(result: dict[str, Any], out_dir: Path, title: str | None = None
                    ) -> list[Path]:
    """The three standard plots of a run into ``out_dir``; returns their paths.

    ``title``: the second title line of every plot (default :func:`run_title`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recs = result["records"]
    title = run_title(result) if title is None else title
    paths = [
        plot_accuracy(recs, out_dir / RUN_PLOTS[0], title,
                      initial=result.get("initial_accuracy"), clock=clock_of(result),
                      evaluation=result.get("evaluation") or "central"),
        plot_queues(recs, out_dir / RUN_PLOTS[1], title,
                    delta=(result.get("participation") or {}).get("delta")),
        plot_participation(result["participation"], out_dir / RUN_PLOTS[2], title),
    ]
    log.info("plots written to %s", out_dir)
    return paths
