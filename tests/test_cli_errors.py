"""``fedcure`` errors speak the user's words: one line naming the option or configuration-file key
the user wrote, exit code 2, no traceback, and nothing created before the inputs are checked;
``--help`` pages show the defaults (issue 18)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fedcure_app.cli import build_parser, main
from fedcure_app.cli.errors import FLAGS, flag_of

MISSING = "/nonexistent/fedcure-data"


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """Run ``fedcure ARGV`` in this process; (exit code, stderr)."""
    code = main(list(argv))
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def made(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["simulate", "--rounds", "0"], "fedcure simulate: error: --rounds must be >= 1 (got 0)"),
    (["simulate", "--edges", "0"], "fedcure simulate: error: --edges must be >= 1 (got 0)"),
    (["launch", "--edges", "0", "--clients", "2", "--out", "o"],
     "fedcure launch: error: --edges must be >= 1 (got 0)"),
    (["launch", "--edges", "2", "--clients", "1", "--out", "o"],
     "fedcure launch: error: --edges (2) > --clients (1): every edge server needs at least one "
     "client"),
    (["simulate", "--max-concurrent", "4", "--edges", "3"],
     "fedcure simulate: error: --max-concurrent K=4 exceeds --edges M=3 (the number of "
     "coalitions); use K <= 3"),
    (["form", "--classes", "1"], "fedcure form: error: --classes must be >= 2 (got 1)"),
    (["form", "--classes", "3", "--classes-per-edge", "4"],
     "fedcure form: error: --classes-per-edge (4) must be <= --classes (3) for --partition "
     "edge-noniid"),
    (["data", "info", "--clients", "0"], "fedcure data: error: --clients must be >= 1 (got 0)"),
    (["launch", "--edges", "1", "--clients", "1", "--threads", "0", "--out", "o"],
     "fedcure launch: error: --threads must be >= 1 (got 0)"),
    (["experiment", "formation", "--seeds", "0", "--out", "o"],
     "fedcure experiment: error: --seeds must be >= 1 (got 0)"),
])
def test_an_option_out_of_range_is_named_as_typed(capsys, in_tmp, argv, expected):
    code, err = run_cli(capsys, *argv)
    assert code == 2
    assert one_line(err) == expected
    assert made(in_tmp) == []


def test_a_default_the_user_never_set_is_named_with_its_option(capsys, in_tmp):
    code, err = run_cli(capsys, "simulate", "--clients", "3")
    assert code == 2
    assert one_line(err) == ("fedcure simulate: error: num-edges (default 5; set it with --edges) "
                             "(5) > --clients (3): every edge server needs at least one client")


def test_config_file_errors_name_the_file_section_and_key(capsys, in_tmp):
    (in_tmp / "bad.toml").write_text("[federation]\nnum-clients = 0\n")
    code, err = run_cli(capsys, "simulate", "--config", "bad.toml", "--out", "o")
    assert code == 2
    assert one_line(err) == ("fedcure simulate: error: bad.toml: [federation] num-clients must "
                             "be >= 1 (got 0)")
    assert made(in_tmp) == ["bad.toml"]


def test_an_unknown_config_key_suggests_the_right_spelling(capsys, in_tmp):
    (in_tmp / "typo.toml").write_text("[run]\nglobal_round = 3\n[fed]\nx = 1\n")
    code, err = run_cli(capsys, "simulate", "--config", "typo.toml")
    assert code == 2
    line = one_line(err)
    assert "typo.toml: [run] global_round is not a key of [run] (did you mean global-rounds?)" \
        in line
    assert "typo.toml: [fed] is not a section" in line


def test_a_conflict_between_file_and_option_names_both(capsys, in_tmp):
    (in_tmp / "m3.toml").write_text("[federation]\nnum_edges = 3\n")
    code, err = run_cli(capsys, "simulate", "--config", "m3.toml", "--clients", "2")
    assert code == 2
    assert one_line(err) == ("fedcure simulate: error: m3.toml: [federation] num-edges (3) > "
                             "--clients (2): every edge server needs at least one client")


def test_a_missing_config_file_is_named_with_its_option(capsys, in_tmp):
    code, err = run_cli(capsys, "launch", "--edges", "1", "--clients", "1", "--out", "o",
                        "--config", "nope.toml")
    assert code == 2
    assert one_line(err) == ("fedcure launch: error: --config nope.toml: configuration file not "
                             "found: nope.toml")
    assert made(in_tmp) == []


def _data_dir_commands() -> list[list[str]]:
    """Every ``fedcure`` sub-command (and sub-sub-command) that takes ``--data-dir``, with the
    arguments it requires besides it."""
    required = {"launch": ["--edges", "1", "--clients", "1", "--out", "o"],
                "testbed": ["--out", "o"],
                "experiment": ["formation", "--out", "o"]}
    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
        if any("--data-dir" in a.option_strings for a in parser._actions):
            found.append(path)

    walk(build_parser(), [])
    return [[*p, *required.get(p[0], [])] for p in found]


def test_every_command_with_a_data_dir_is_covered():
    assert {c[0] for c in _data_dir_commands()} == {"data", "simulate", "launch", "testbed",
                                                    "experiment"}


@pytest.mark.parametrize("argv", _data_dir_commands(), ids=lambda a: " ".join(a[:2]))
def test_a_missing_data_directory_is_one_line_and_makes_nothing(capsys, in_tmp, argv):
    code, err = run_cli(capsys, *argv, "--dataset", "mnist", "--data-dir", MISSING)
    assert code == 2
    line = one_line(err)
    assert f"error: --data-dir {MISSING}: " in line and "MNIST not found" in line, line
    assert made(in_tmp) == [], "files were made before the inputs were checked"


def test_the_launch_entry_point_prints_no_traceback(tmp_path: Path):
    """The issue's own case, through the real entry point: no processes, no --out folder."""
    done = subprocess.run(
        [sys.executable, "-m", "fedcure_app.cli", "launch", "--dataset", "mnist", "--data-dir",
         MISSING, "--edges", "1", "--clients", "1", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr).startswith(f"fedcure launch: error: --data-dir {MISSING}: ")
    assert not (tmp_path / "out").exists()


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    out = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}".strip())

    walk(build_parser(), "")
    return out


def test_help_pages_show_every_default():
    for name, parser in _all_parsers():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if (not action.option_strings or action.help == argparse.SUPPRESS
                    or any(action.default is x for x in (None, False, argparse.SUPPRESS))):
                continue
            shown = str(action.default)
            assert f"default: {shown}" in text or f"default {shown}" in text \
                or "(default" in " ".join((action.help or "").split()), (name, action.dest)
    simulate = " ".join(dict(_all_parsers())["simulate"].format_help().split())
    assert "--rounds ROUNDS global rounds (edge-model arrivals) (default: 100)" in simulate
    assert "(default: results/simulate)" in simulate


def test_the_flag_table_agrees_with_every_command():
    from fedcure_app.cli import data, form, launch, simulate

    for module in (simulate, launch, form, data):
        for dest, key in module._OPTIONS.items():
            if key in FLAGS:
                assert FLAGS[key] == flag_of(dest), (module.__name__, dest, key)


def test_a_role_failing_at_start_is_one_line_with_its_reason(capsys, in_tmp, monkeypatch):
    """A role that exits at start (e.g. a cloud refusing its flags) ends ``fedcure launch`` with
    one line quoting the role's own last log line, its exit code, and no traceback."""
    from fedcure_app.cli import launch

    def fail(cfg, args, out, roles, site=None):
        raise RuntimeError("cloud exited with code 2 at start; its log ends with:\n"
                           "12:00:00 INFO fedcure.cloud: starting\n"
                           "fedcure-cloud: error: --listen expects HOST:PORT")

    monkeypatch.setattr(launch, "start_roles", fail)
    code, err = run_cli(capsys, "launch", "--edges", "1", "--clients", "1", "--out", "o")
    assert code == 2
    flower, _, err = err.partition("\n")  # the launch says the Flower version first
    assert flower.startswith("Flower ") and "fast path" in flower
    assert one_line(err) == ("fedcure launch: error: cloud exited with code 2 at start: "
                             f"fedcure-cloud: error: --listen expects HOST:PORT; logs in "
                             f"{in_tmp / 'o' / 'logs'}")


@pytest.mark.parametrize(("argv", "expected"), [
    (["simulate", "--dataset", "mnsit"],
     "fedcure simulate: error: argument --dataset: invalid choice: 'mnsit' (choose from "
     "'digits', 'mnist', 'cifar10', 'svhn', 'cinic10'); did you mean 'mnist'? "
     "(see fedcure simulate --help)"),
    (["simulate", "--rounds", "x"],
     "fedcure simulate: error: argument --rounds: invalid int value: 'x' "
     "(see fedcure simulate --help)"),
    (["simulat"], "fedcure: error: argument COMMAND: invalid choice: 'simulat' (choose from "
     "'form', 'data', 'task', 'simulate', 'launch', 'testbed', 'model', 'certs', 'experiment'); "
     "did you mean 'simulate'? (see fedcure --help)"),
])
def test_a_malformed_command_line_is_one_line_pointing_at_help(capsys, argv, expected):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert one_line(capsys.readouterr().err) == expected


@pytest.mark.parametrize("prog", ["fedcure-cloud", "fedcure-edge", "fedcure-client"])
def test_the_roles_report_a_malformed_command_line_in_one_line(capsys, prog):
    import importlib

    module = {"fedcure-cloud": "cloud_server.cli", "fedcure-edge": "edge_server.cli",
              "fedcure-client": "client.cli"}[prog]
    parser = importlib.import_module(module).build_parser()
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--bogus"])
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"{prog}: error: ") and line.endswith(f"(see {prog} --help)"), line


def test_a_method_key_at_the_top_level_is_told_its_section(capsys, in_tmp):
    (in_tmp / "top.toml").write_text("tau-c = 3\n")
    code, err = run_cli(capsys, "simulate", "--config", "top.toml")
    assert code == 2
    assert one_line(err) == ("fedcure simulate: error: top.toml: tau-c is a key of [method], not "
                             "a section: write it under [method] ([method] tau-c = ...)")
    assert made(in_tmp) == ["top.toml"]


def test_a_key_in_the_wrong_section_is_told_where_it_belongs(capsys, in_tmp):
    (in_tmp / "moved.toml").write_text("[run]\ntau_c = 3\n")
    code, err = run_cli(capsys, "simulate", "--config", "moved.toml")
    assert code == 2
    assert one_line(err) == ("fedcure simulate: error: moved.toml: [run] tau_c is not a key of "
                             "[run] but of [method]: move it under [method]")


def test_the_schema_names_the_section_of_a_misplaced_key():
    from fedcure_app.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"^invalid configuration: tau-c: unknown key; it "
                       r"belongs under \[method\]$"):
        build_config({"tau-c": 3})
    with pytest.raises(ConfigError, match=r"run\.tau-c: unknown key; it belongs under "
                       r"\[method\]$"):
        build_config({"run": {"tau-c": 3}})
    with pytest.raises(ConfigError, match=r"run\.bogus: unknown key$"):
        build_config({"run": {"bogus": 3}})
