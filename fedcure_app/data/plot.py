"""The label distribution of each coalition (edge server), drawn to PNG with matplotlib (Agg).

Left panel: a stacked bar per coalition of its class shares (each bar sums to 1), labelled with
its client and sample counts. Right panel: a violin per coalition of those class shares, with the
uniform share 1/C dashed: IID coalitions sit tight on the line, one-class-heavy ones spread out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("both", "bar", "violin")


def _colours(n: int) -> list:
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["viridis"](i / max(1, n - 1)) for i in range(n)]


def _coalition_counts(counts: np.ndarray, assignment, num_edges: int | None
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """(M, C) coalition counts and, when clients were given, clients per coalition."""
    if assignment is None:
        return counts, None
    a = np.asarray(assignment, dtype=np.int64)
    if a.shape != (counts.shape[0],):
        raise ValueError(f"assignment must have shape ({counts.shape[0]},), got {a.shape}")
    m = int(num_edges) if num_edges is not None else int(a.max()) + 1
    return coalition_label_counts(counts, a, m), np.bincount(a, minlength=m)


def _average_jsd(edge_counts: np.ndarray) -> float | None:
    if edge_counts.shape[0] < 2 or np.any(edge_counts.sum(axis=1) <= 0):
        return None
    return float(average_pairwise_jsd(edge_counts))


def plot_label_distribution(
    counts,
    path: str | Path,
    *,
    assignment=None,
    num_edges: int | None = None,
    title: str = "Label distribution per coalition",
    class_names: Sequence[str] | None = None,
    kind: str = "both",
) -> Path:
    """Draw coalition label distributions to the PNG ``path`` and return it.

    ``counts``: (M, C) label counts per coalition, or (N, C) per client together with
    ``assignment`` (N,) client→coalition (then ``num_edges`` sets M, default max + 1).
    ``kind``: ``both`` (bars and violins), ``bar`` or ``violin``. The average pairwise JSD
    (nats) is added to the title when every coalition is non-empty.
    """
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"counts must be a non-empty 2-D (M, C) array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("counts must be finite and non-negative")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    edge, clients = _coalition_counts(arr, assignment, num_edges)
    m, c = edge.shape
    names = list(class_names) if class_names is not None else [str(i) for i in range(c)]
    if len(names) != c:
        raise ValueError(f"{len(names)} class names for {c} classes")
    totals = edge.sum(axis=1)
    shares = np.divide(edge, totals[:, None], out=np.zeros_like(edge), where=totals[:, None] > 0)

    panels = ["bar", "violin"] if kind == "both" else [kind]
    width = min(30.0, 3.0 + max(4.0, 0.45 * m) * len(panels))
    fig = Figure(figsize=(width, 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    x = np.arange(m)
    ticks = [f"ES {i}" if clients is None else f"ES {i}\n{clients[i]} cl." for i in range(m)]
    for ax, panel in zip(axes, panels):
        if panel == "bar":
            bottom = np.zeros(m)
            for k, colour in enumerate(_colours(c)):
                ax.bar(x, shares[:, k], bottom=bottom, color=colour, label=names[k], width=0.8)
                bottom += shares[:, k]
            for i in range(m):
                ax.text(i, 1.01, f"{int(totals[i]):,}", ha="center", va="bottom", fontsize=7)
            ax.set_ylim(0, 1.08)
            ax.set_ylabel("class share")
            ax.set_title("class shares (bar top: samples)", fontsize=10)
            ax.legend(title="class", fontsize=7, title_fontsize=8, loc="upper left",
                      bbox_to_anchor=(1.0, 1.0), ncol=1 if c <= 12 else 2)
        else:
            filled = [i for i in range(m) if totals[i] > 0]
            if filled:
                parts = ax.violinplot([shares[i] for i in filled], positions=filled,
                                      showmedians=True, widths=0.8)
                for body in parts["bodies"]:
                    body.set_alpha(0.6)
                for i in filled:
                    ax.scatter(np.full(c, i), shares[i], s=8, color="black", zorder=3)
            ax.axhline(1.0 / c, color="grey", linestyle="--", linewidth=1, label="uniform 1/C")
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("class share")
            ax.set_title("spread of class shares per coalition", fontsize=10)
            ax.legend(fontsize=7, loc="upper right")
        ax.set_xticks(x, ticks, fontsize=7 if m > 12 else 9)
        ax.set_xlim(-0.6, m - 0.4)
    jsd = _average_jsd(edge)
    fig.suptitle(title if jsd is None else f"{title} — average pairwise JSD {jsd:.3f} nats")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=120)
    log.info("wrote %s", out)
    return out
