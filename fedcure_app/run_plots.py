"""PNG plots of a run's per-round records: accuracy vs time, queues, participation.

Shared by every driver that writes a ``result.json``: ``fedcure simulate``, the Flower
ServerApp and the cloud server (whose ``time_s`` is wall time since round 0).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

log = logging.getLogger(__name__)


def plot_accuracy(records: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Test accuracy (%) against simulated time (s), from the evaluated rounds."""
    pts = [(r["time_s"], 100 * r["accuracy"]) for r in records if r.get("accuracy") is not None]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    if pts:
        t, a = zip(*pts)
        ax.plot(t, a, marker="o", ms=3)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title or "Accuracy vs simulated time")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_queues(records: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Virtual-queue length Λ_m per coalition against the global round."""
    q = np.array([r["queues"] for r in records], dtype=float)
    rounds = [r["round"] for r in records]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    if q.size:
        for m in range(q.shape[1]):
            ax.plot(rounds, q[:, m], label=f"coalition {m}", lw=1)
        if q.shape[1] <= 10:
            ax.legend(fontsize=7, ncol=2)
    ax.set_xlabel("global round")
    ax.set_ylabel("virtual queue Λ")
    ax.set_title(title or "Virtual queues")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_participation(participation: dict[str, Any], path: Path, title: str = "") -> Path:
    """Each coalition's share of global rounds next to its target share δ_m."""
    share = np.asarray(participation["share"], dtype=float)
    delta = np.asarray(participation["delta"], dtype=float)
    x = np.arange(len(share))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.bar(x - 0.2, share, width=0.4, label="share of rounds")
    ax.bar(x + 0.2, delta, width=0.4, label="target δ_m")
    ax.set_xticks(x)
    ax.set_xlabel("coalition")
    ax.set_ylabel("fraction of global rounds")
    ax.set_title(title or "Participation per coalition")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_run_plots(result: dict[str, Any], out_dir: Path, title: str = "") -> list[Path]:
    """The three standard plots of a run into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recs = result["records"]
    paths = [
        plot_accuracy(recs, out_dir / "accuracy.png", title),
        plot_queues(recs, out_dir / "queues.png", title),
        plot_participation(result["participation"], out_dir / "participation.png", title),
    ]
    log.info("plots written to %s", out_dir)
    return paths
