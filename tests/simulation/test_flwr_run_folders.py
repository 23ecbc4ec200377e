"""``flwr run`` results: one folder per run, a ``latest`` pointer only a finished run moves, a
failed run that removes nothing and ends its log with FedCure's one line (Flower's traceback
only with ``debug=true``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.common.logger import FLOWER_LOGGER

from fedcure_app.config import ConfigError
from fedcure_app.flower.app_config import app_options
from fedcure_app.flower.run_folders import latest_run, mark_latest, note_failure, run_dir
from fedcure_app.flower.server_app import QuietFailure, RunFailed, main, results_dir


def test_latest_names_the_last_marked_run_and_is_a_plain_file(tmp_path: Path):
    assert latest_run(tmp_path) is None
    for rid in (11, 22):
        run_dir(tmp_path, rid).mkdir()
        pointer = mark_latest(tmp_path, rid)
        assert pointer.is_file() and not pointer.is_symlink()
        assert pointer.read_text() == f"{rid}\n"
        assert latest_run(tmp_path) == tmp_path / str(rid)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["11", "22", "latest"]
    (tmp_path / "latest").write_text("../elsewhere\n")  # never leaves out-dir
    assert latest_run(tmp_path) is None
    for bad in ("", "..", "latest", "a/b"):
        with pytest.raises(ValueError):
            run_dir(tmp_path, bad)


def test_a_failure_note_is_one_line(tmp_path: Path):
    path = note_failure(tmp_path / "7", "bad\n  thing")
    assert path is not None and path.read_text() == "bad thing\n"


def test_results_go_to_a_run_folder_unless_run_folders_is_off(tmp_path: Path):
    opts = app_options({"out-dir": str(tmp_path)})
    assert opts.run_folders and not opts.debug
    assert results_dir(opts, 42) == tmp_path.resolve() / "42"
    assert results_dir(opts, None) == tmp_path.resolve()
    flat = app_options({"out-dir": str(tmp_path), "run-folders": False, "debug": "true"})
    assert results_dir(flat, 42) == tmp_path.resolve() and flat.debug
    with pytest.raises(ConfigError, match="debug must be true or false"):
        app_options({"debug": "maybe"})


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def flower_lines():
    handler = _Lines()
    FLOWER_LOGGER.addHandler(handler)
    before = list(FLOWER_LOGGER.filters)
    yield handler.lines
    FLOWER_LOGGER.removeHandler(handler)
    for f in list(FLOWER_LOGGER.filters):
        if f not in before:
            FLOWER_LOGGER.removeFilter(f)


def _fail(tmp_path: Path, run_id: int, **extra) -> RunFailed:
    ctx = SimpleNamespace(run_config={"out-dir": str(tmp_path), "dataset": "nope", **extra},
                          run_id=run_id)
    with pytest.raises(RunFailed) as err:
        main(None, ctx)  # fails on the configuration, before it needs a grid
    return err.value


def _flower_reports(err: BaseException) -> None:
    """What Flower's simulation process logs after the ServerApp raised ``err``."""
    try:
        raise RuntimeError("wrapped") from err
    except RuntimeError as wrapped:
        FLOWER_LOGGER.error("Simulation raised an exception", exc_info=wrapped)
    FLOWER_LOGGER.error("Exit Code: 700\nAn unhandled exception occurred when running the "
                        "simulation.\n\nFor more information, visit: <https://flower.ai>")


def test_a_failed_run_keeps_the_good_one_and_its_line_is_the_last(tmp_path: Path,
                                                                  flower_lines):
    good = run_dir(tmp_path, 1)
    good.mkdir()
    (good / "result.json").write_text("{}")
    mark_latest(tmp_path, 1)
    err = _fail(tmp_path, 2)
    _flower_reports(err)
    assert (good / "result.json").read_text() == "{}" and latest_run(tmp_path) == good
    reason = (tmp_path / "2" / "failed.txt").read_text().strip()
    assert reason.startswith("invalid configuration: data.dataset")
    assert flower_lines == [f"[fedcure] run failed: {reason}"]


def test_debug_keeps_flowers_traceback(tmp_path: Path, flower_lines):
    err = _fail(tmp_path, 3, debug=True)
    _flower_reports(err)
    assert flower_lines[0].startswith("[fedcure] run failed: invalid configuration")
    assert flower_lines[1].startswith("Simulation raised an exception\nTraceback")
    assert flower_lines[2].startswith("Exit Code: 700")


def test_the_filter_drops_only_the_report_of_its_own_failure():
    ours, other = RunFailed("x"), ValueError("y")
    quiet = QuietFailure(ours)

    def rec(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("flwr", logging.ERROR, __file__, 1, msg, None, info)

    assert quiet.filter(rec("Exit Code: 700"))  # nothing of ours dropped yet: kept
    assert quiet.filter(rec("boom", other))
    assert not quiet.filter(rec("Simulation raised an exception", ours))
    assert not quiet.filter(rec("Exit Code: 700\n..."))
    assert quiet.filter(rec("an unrelated line"))
    assert sys.exc_info()[0] is None
