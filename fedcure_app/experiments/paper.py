"""The paper's published figures we could find, with where they come from.

Only numbers that were found in a public source are listed. The per-dataset cells of the paper's
Table 1 were *not* found (the abstract and summaries of arXiv:2511.10227 were; the body of its
experiments section was not reachable from here), so the report says so instead of printing them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperFigure:
    """One published number: what it measures, its value, and its source."""

    key: str
    what: str
    value: float
    source: str


SOURCE_ABSTRACT = ("Chen et al., \"FedCure: Mitigating Participation Bias in Semi-Asynchronous "
                   "Federated Learning with Non-IID Data\", arXiv:2511.10227v1, abstract")
SOURCE_FIG2 = "the paper's Fig. 2 as quoted in the project's issue 7 (50 clients, 5 ESs)"

PAPER: dict[str, PaperFigure] = {
    "max_accuracy_ratio": PaperFigure(
        "max_accuracy_ratio",
        "largest accuracy ratio FedCure / baseline over the four datasets (\"up to 5.1x\")",
        5.1, SOURCE_ABSTRACT),
    "lowest_latency_cov": PaperFigure(
        "lowest_latency_cov", "lowest coefficient of variation of per-round latency (FedCure)",
        0.0223, SOURCE_ABSTRACT),
    "jsd_before": PaperFigure("jsd_before", "average pairwise JSD before formation (nats)",
                              0.69, SOURCE_FIG2),
    "jsd_after": PaperFigure("jsd_after", "average pairwise JSD after formation (nats)",
                             0.0, SOURCE_FIG2),
}

#: Said in the report where the paper's Table 1 cells would go.
TABLE1_MISSING = (
    "The paper's per-dataset Table 1 accuracies could not be retrieved here (only the abstract "
    "and summaries of arXiv:2511.10227 were reachable), so no paper column is printed; we do "
    "not reconstruct them. The paper's headline claims are compared below instead."
)

__all__ = ["PAPER", "PaperFigure", "TABLE1_MISSING"]
