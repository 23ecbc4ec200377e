"""What a first try at the command line meets: every ``--help`` shows every default, the hint
for missing data names a command that exists, ``fedcure launch`` reports the real mistake first,
and its progress line counts the edges."""

from __future__ import annotations

import argparse
import re
import shlex
from types import SimpleNamespace

import pytest

from fedcure_app.cli import build_parser, main


def _walk(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _walk(p, f"{name} {sub}")


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    import client.cli
    import cloud_server.cli
    import edge_server.cli

    return [*_walk(build_parser(), "fedcure"),
            ("fedcure-cloud", cloud_server.cli.build_parser()),
            ("fedcure-edge", edge_server.cli.build_parser()),
            ("fedcure-client", client.cli.build_parser())]


def test_the_walk_finds_every_command():
    names = {n for n, _ in _all_parsers()}
    assert {"fedcure simulate", "fedcure launch", "fedcure data info", "fedcure experiment",
            "fedcure form", "fedcure certs", "fedcure-cloud", "fedcure-edge",
            "fedcure-client"} <= names


@pytest.mark.parametrize("name,parser", _all_parsers(), ids=lambda x: x if isinstance(x, str)
                         else "")
def test_every_optional_value_option_shows_its_default_in_help(name, parser):
    """Every option that takes a value and is not required says its default in ``--help``
    (flags are off unless given)."""
    missing = []
    for action in parser._actions:
        if (not action.option_strings or action.required
                or (action.nargs == 0 and (action.default is None or action.default is False))
                or isinstance(action, argparse._HelpAction)):
            continue
        text = parser._get_formatter()._expand_help(action) if action.help is not None else ""
        if "default" not in text.lower():
            missing.append(action.option_strings[-1])
    assert not missing, f"{name}: no default shown for {missing}"
    assert "default: None" not in parser.format_help()


def test_simulate_help_shows_the_method_default(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--method \{[^}]*\} .*\(default: none", text)


def test_the_missing_dataset_hint_names_a_command_that_parses(tmp_path, capsys):
    """The hint's command is a real ``fedcure`` command line (``data info … --download``)."""
    code = main(["simulate", "--dataset", "mnist", "--data-dir", str(tmp_path / "none"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    hint = re.search(r"`(fedcure [^`]+)`", err)
    assert hint, err
    argv = shlex.split(hint.group(1))[1:]
    args = build_parser().parse_args(argv)
    assert args.download and args.dataset == "mnist" and args.data_dir == str(tmp_path / "none")
    assert not (tmp_path / "out").exists()


def test_launch_reports_edges_above_clients_first_without_out(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code = main(["launch", "--clients", "1", "--edges", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--edges (3) > --clients (1)" in err and "--out" not in err
    assert not (tmp_path / "results").exists()  # checked before anything is made


def test_launch_has_a_default_out():
    args = build_parser().parse_args(["launch", "--clients", "2", "--edges", "1"])
    assert args.out == "results/launch"


def _status(phase: str, **kw):
    from fedcure_app.protocol import cloud_pb2 as pb

    base = dict(clients_registered=0, expected_clients=6, edges_connected=0, num_edges=2,
                progress=[])
    base.update(kw)
    return SimpleNamespace(phase=getattr(pb.StatusReply, phase), **base)


def test_launch_progress_counts_edges_connected_then_done():
    from fedcure_app.cli.launch import status_text
    from fedcure_app.protocol import cloud_pb2 as pb

    assert status_text(_status("REGISTERING", clients_registered=4, edges_connected=1)) == \
        "4/6 clients, 1/2 edges connected"
    assert status_text(_status("TRAINING", edges_connected=2)) == "2/2 edges connected"
    p = pb.CoalitionProgress(coalition=1, edge_round=3, tau_e=12, training_client_ids=[3, 5],
                             eta_s=40.0)
    text = status_text(_status("TRAINING", edges_connected=2, progress=[p]))
    assert text == "2/2 edges connected · c1 e4/12 wait[3,5] ~40s"
    # once done, the edges leave the cloud as they finish: still connected != done
    assert status_text(_status("DONE", edges_connected=2)) == "0/2 edges done"
    assert status_text(_status("DONE", edges_connected=1)) == "1/2 edges done"
    assert status_text(_status("DONE", edges_connected=0), edges_done=2) == "2/2 edges done"


@pytest.mark.parametrize("argv,every", [([], 1), (["--rounds", "40"], 4),
                                        (["--rounds", "40", "--eval-every", "7"], 7)])
def test_a_launch_evaluates_about_ten_times_unless_told(argv, every):
    """A 5-round launch evaluates every round (an accuracy curve, not two points)."""
    from fedcure_app.cli.launch import config_from_args

    args = build_parser().parse_args(["launch", "--clients", "2", "--edges", "1",
                                      "--rounds", "5", *argv])
    assert config_from_args(args).run.eval_every == every


def test_a_config_files_eval_every_is_kept(tmp_path):
    from fedcure_app.cli.launch import config_from_args

    cfg = tmp_path / "c.toml"
    cfg.write_text("[run]\neval-every = 3\n")
    args = build_parser().parse_args(["launch", "--clients", "2", "--edges", "1",
                                      "--rounds", "40", "--config", str(cfg)])
    assert config_from_args(args).run.eval_every == 3


def test_building_the_parsers_imports_no_torch():
    """``fedcure form``/``--help`` start fast: torch is imported by the handlers only."""
    import subprocess
    import sys

    from fedcure_app.cli.simulate import DEVICE_CHOICES
    from fedcure_app.training import DEVICES

    assert DEVICE_CHOICES == DEVICES
    code = ("import sys; from fedcure_app.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'flwr') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_the_launch_progress_line_fits_80_columns_and_keeps_the_round():
    """The issue's line: at 80 columns the round and the elapsed time stay, the per-coalition
    detail is cut at its end; wide terminals get all of it and a bar."""
    from fedcure_app.cli.launch import progress_line

    detail = ("3/3 edges connected · c0 e6/12 wait[0,1] ~14s | c1 e3/12 wait[2,3] ~30s | "
              "c2 e1/12 wait[4,5] ~50s")
    line = progress_line("training", 3, 10, detail, 83.4, 80)
    assert len(line) <= 79
    assert line.startswith("training round 3/10 3/3 edges connected · c0 e6/12")
    assert line.endswith("… 0:01:23")
    wide = progress_line("training", 3, 10, detail, 83.4, 200)
    assert detail in wide and "━" in wide and wide.endswith(" 0:01:23")
    for width in range(20, 200, 7):
        assert len(progress_line("training", 3, 10, detail, 83.4, width)) <= max(width - 1, 27)


def test_the_launch_progress_says_waiting_for_edges_until_one_connects():
    from fedcure_app.cli.launch import phase_label

    assert phase_label(_status("TRAINING", edges_connected=0)) == "waiting for edges"
    assert phase_label(_status("TRAINING", edges_connected=1)) == "training"
    assert phase_label(_status("REGISTERING")) == "registering"
    assert phase_label(_status("DONE", edges_connected=2)) == "done"


@pytest.mark.parametrize("device", ["cuda", "auto", "cpu"])
def test_launch_passes_device_to_every_client(device, tmp_path, monkeypatch):
    """``fedcure launch --device D`` starts each ``fedcure-client`` with ``--device D`` (cpu,
    the default, leaves the client's own default, $FEDCURE_DEVICE, alone)."""
    from fedcure_app.cli import launch
    from tests.launch_children import record_children

    started = record_children(monkeypatch)
    args = build_parser().parse_args(["launch", "--clients", "2", "--edges", "1",
                                      "--device", device, "--no-dashboard"])
    launch.start_roles(launch.config_from_args(args), args, tmp_path, launch.Roles())
    clients = [c.argv for c in started if c.name.startswith("client")]
    assert len(clients) == 2
    for argv in clients:
        assert (argv[argv.index("--device") + 1] == device) if device != "cpu" \
            else "--device" not in argv
