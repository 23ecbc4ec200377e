"""The label-distribution plot writes a readable PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcure_app.data.partition import partition_dataset
from fedcure_app.data.plot import plot_label_distribution


def _is_png(path: Path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        return im.size


@pytest.mark.parametrize("kind", ["both", "bar", "violin"])
def test_coalition_counts_to_png(tmp_path: Path, kind: str):
    counts = np.array([[10, 0, 5], [0, 8, 8], [3, 3, 3]])
    out = plot_label_distribution(counts, tmp_path / "sub" / "p.png", kind=kind,
                                  class_names=["a", "b", "c"])
    w, h = _is_png(out)
    assert w > 400 and h > 300


def test_per_client_counts_with_assignment(tmp_path: Path):
    y = np.random.default_rng(0).integers(0, 10, 2000)
    p = partition_dataset(y, 20, 4, "edge-noniid")
    out = plot_label_distribution(p.label_counts, tmp_path / "p.png",
                                  assignment=p.initial_assignment, num_edges=4)
    assert _is_png(out)[0] > 400


def test_empty_coalition_is_drawn(tmp_path: Path):
    counts = np.array([[1, 2], [0, 0]])
    assert _is_png(plot_label_distribution(counts, tmp_path / "p.png"))


def test_bad_inputs(tmp_path: Path):
    with pytest.raises(ValueError, match="2-D"):
        plot_label_distribution(np.ones(3), tmp_path / "p.png")
    with pytest.raises(ValueError, match="non-negative"):
        plot_label_distribution(-np.ones((2, 2)), tmp_path / "p.png")
    with pytest.raises(ValueError, match="kind"):
        plot_label_distribution(np.ones((2, 2)), tmp_path / "p.png", kind="pie")
    with pytest.raises(ValueError, match="class names"):
        plot_label_distribution(np.ones((2, 2)), tmp_path / "p.png", class_names=["x"])
    with pytest.raises(ValueError, match="assignment"):
        plot_label_distribution(np.ones((3, 2)), tmp_path / "p.png", assignment=[0, 1])
    assert not (tmp_path / "p.png").exists()
