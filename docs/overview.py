"""Draw docs/overview.png, the README's picture, from the README's main job.

    fedcure simulate --dataset digits --method fedcure --rounds 40 --out results/digits
    python3 docs/overview.py results/digits/result.json docs/overview.png

Left and middle: the label mix of each edge server's coalition on the default edge non-IID
partition (50 clients, 5 edge servers, digits) before and after FedCure's coalition formation;
right: the run's test accuracy against simulated time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def shares(counts: np.ndarray, assignment: np.ndarray, m: int) -> np.ndarray:
    """Class shares (rows: coalitions) of the label counts ``counts`` (clients × classes)."""
    per = np.stack([counts[assignment == e].sum(axis=0) for e in range(m)]).astype(float)
    return per / np.maximum(per.sum(axis=1, keepdims=True), 1)


def main(result_path: str, out_path: str) -> Path:
    from fedcure_app.federation import partition_for
    from fedcure_app.config import FedCureConfig
    from fedcure_app.core.coalition import form_coalitions
    from fedcure_app.core.divergence import average_pairwise_jsd
    from fedcure_app.data import load_dataset

    result = json.loads(Path(result_path).read_text())
    cfg = FedCureConfig()
    m = cfg.federation.num_edges
    part = partition_for(cfg, load_dataset("digits"))
    counts, before = part.label_counts, part.initial_assignment
    after = form_coalitions(counts, before, m, rule="fedcure", seed=cfg.run.seed).assignment

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110,
                             gridspec_kw={"width_ratios": [1, 1, 1.4]})
    for ax, assign, what in ((axes[0], before, "before formation"),
                             (axes[1], after, "after FedCure's formation")):
        s = shares(counts, assign, m)
        bottom = np.zeros(m)
        for c in range(s.shape[1]):
            ax.bar(range(m), s[:, c], bottom=bottom, color=plt.cm.tab10(c % 10),
                   label=str(c))
            bottom += s[:, c]
        jsd = average_pairwise_jsd(shares(counts, assign, m))
        ax.set_title(f"label mix per edge server, {what}\n(average pairwise JSD {jsd:.2f})",
                     fontsize=9)
        ax.set_xticks(range(m), [f"ES {e}" for e in range(m)], fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("class share", fontsize=8)
    axes[1].legend(title="digit", fontsize=6, title_fontsize=7, loc="upper left",
                   bbox_to_anchor=(1.0, 1.0), ncol=1)
    pts = [(0.0, 100 * result["initial_accuracy"])] if result.get("initial_accuracy") else []
    pts += [(r["time_s"], 100 * r["accuracy"]) for r in result["records"]
            if r.get("accuracy") is not None]
    t, a = zip(*pts)
    ax = axes[2]
    ax.plot(t, a, marker="o", ms=3)
    ax.set_ylim(0, 100)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.set_xlabel("simulated time (s)", fontsize=8)
    ax.set_ylabel("test accuracy (%)", fontsize=8)
    ax.set_title(f"semi-asynchronous training: {result['rounds']} global rounds,\n"
                 f"final accuracy {100 * result['final_accuracy']:.1f} %", fontsize=9)
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(*(sys.argv[1:3] if len(sys.argv) > 2 else
                 ["results/digits/result.json", "docs/overview.png"])))
