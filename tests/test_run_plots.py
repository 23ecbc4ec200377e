"""Run plots say what they show (issue 18): the clock of the time axis, the initial evaluation,
whole-number round ticks, legends clear of the data, and titles naming formation and scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcure_app import run_plots


def _result(mode: str | None, rounds: int = 3, edges: int = 3) -> dict:
    records = [{"round": r, "time_s": 20.0 * r, "accuracy": 0.2 + 0.1 * r,
                "queues": [0.5 * r * (m + 1) / edges for m in range(edges)]}
               for r in range(1, rounds + 1)]
    out = {"dataset": "digits", "initial_accuracy": 0.1, "records": records,
           "config": {"method": {"formation": "fedcure", "scheduler": "greedy"}},
           "formation": {"rule": "fedcure"},
           "participation": {"share": [1 / edges] * edges, "delta": [1 / edges] * edges}}
    if mode:
        out["mode"] = mode
    return out


@pytest.fixture
def figures(monkeypatch):
    """Every figure written, drawn, by file name."""
    seen: dict[str, object] = {}
    save = run_plots._save

    def keep(fig, path: Path):
        fig.canvas.draw()
        seen[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(run_plots, "_save", keep)
    return seen


def _outside(fig) -> bool:
    ax = fig.axes[0]
    legend = ax.get_legend()
    return legend is not None and legend.get_window_extent().x0 >= ax.get_window_extent().x1


def test_a_deployment_plot_shows_wall_clock_time_and_the_initial_evaluation(tmp_path, figures):
    paths = run_plots.write_run_plots(_result("deployment"), tmp_path)
    assert [p.name for p in paths] == ["accuracy.png", "queues.png", "participation.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    ax = figures["accuracy.png"].axes[0]
    assert ax.get_xlabel() == "wall-clock time since round 0 was dispatched (s)"
    x, y = ax.lines[0].get_data()
    assert (x[0], y[0]) == (0.0, pytest.approx(10.0)) and len(x) == 4
    for name, fig in figures.items():
        title = fig.axes[0].get_title()
        assert "digits · formation: fedcure · scheduler: greedy" in title, name
        assert _outside(fig), f"{name}: the legend overlaps the data"


def test_a_simulation_plot_says_simulated_time(tmp_path, figures):
    run_plots.write_run_plots(_result(None), tmp_path)
    assert figures["accuracy.png"].axes[0].get_xlabel() == "simulated time (s)"


@pytest.mark.parametrize("rounds", [2, 3, 7, 40])
def test_round_ticks_are_whole_numbers(tmp_path, figures, rounds):
    run_plots.write_run_plots(_result("deployment", rounds=rounds), tmp_path)
    ticks = figures["queues.png"].axes[0].get_xticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_run_title_spells_out_what_is_known():
    assert run_plots.run_title({"dataset": "mnist", "formation": {"rule": "none"},
                                "config": {"method": {"scheduler": "fair"}}}) \
        == "mnist · formation: none · scheduler: fair"
    assert run_plots.run_title({"dataset": "mnist"}) == "mnist"


def test_accuracy_axis_spans_0_to_100_percent_and_few_points_carry_their_values(
        tmp_path, figures):
    run_plots.write_run_plots(_result("deployment", rounds=2), tmp_path)
    ax = figures["accuracy.png"].axes[0]
    assert ax.get_ylim() == (0.0, 100.0)
    labels = [t.get_text() for t in ax.texts]
    assert "10.0 %" in labels and "40.0 %\nround 2" in labels


def test_many_accuracy_points_are_not_labelled(tmp_path, figures):
    run_plots.write_run_plots(_result(None, rounds=run_plots.LABEL_POINTS_MAX + 5), tmp_path)
    assert not figures["accuracy.png"].axes[0].texts


@pytest.mark.parametrize("edges", [1, 5, 12])
def test_queues_get_one_panel_per_coalition_with_its_target_share_and_a_caption(
        tmp_path, figures, edges):
    result = _result(None, rounds=100, edges=edges)
    for r in result["records"]:
        r["dispatched"] = [r["round"] % edges]
    run_plots.write_run_plots(result, tmp_path)
    fig = figures["queues.png"]
    assert len(fig.axes) == edges
    for m, ax in enumerate(fig.axes):
        assert any(f"coalition {m}, " in t.get_text() and r"\delta" in t.get_text()
                   for t in ax.texts)
        marks = [ln for ln in ax.lines if ln.get_marker() == "|"]
        assert list(marks[0].get_xdata()) == [r for r in range(1, 101) if r % edges == m]
    caption = " ".join(t.get_text() for t in fig.axes[-1].texts)
    assert "participation debt" in caption and r"$\delta_m$" in caption


def test_queues_of_many_coalitions_are_one_heat_map(tmp_path, figures):
    run_plots.write_run_plots(_result(None, rounds=10, edges=run_plots.QUEUE_PANELS_MAX + 1),
                              tmp_path)
    fig = figures["queues.png"]
    assert len(fig.axes) == 2 and fig.axes[0].images  # the map and its colour bar


def test_point_labels_of_close_points_do_not_overlap_and_the_last_one_stays(tmp_path, figures):
    """A testbed run evaluated every 10 rounds whose last rounds came close together in time:
    'round 80' and 'round 90' would print over each other."""
    result = _result("deployment", rounds=10)
    for r in result["records"]:
        r["round"] *= 10
        r["time_s"] = 100.0 * min(r["round"], 70) + (r["round"] - 70) * 0.5 * (r["round"] > 70)
        r["accuracy"] = 0.5 + 0.03 * min(r["round"], 70) / 10
    run_plots.write_run_plots(result, tmp_path)
    fig = figures["accuracy.png"]
    ax = fig.axes[0]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # the saved figure's canvas is closed
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert 2 <= len(boxes) < 11, [t.get_text() for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert ax.texts[-1].get_text().endswith("round 100")


def test_labels_of_points_far_apart_are_all_kept(tmp_path, figures):
    run_plots.write_run_plots(_result("deployment", rounds=5), tmp_path)
    assert len(figures["accuracy.png"].axes[0].texts) == 6  # the initial model and 5 rounds
