"""The fast path's one version gate (:mod:`fedcure_app.flower.fastpath.gate`): the range is
FedCure's own requirement on Flower, Flower is found under either distribution name, and the
gate can be forced closed; ``fedcure --version`` says where it stands."""

from __future__ import annotations

import io
import logging
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement
from packaging.version import Version

from fedcure_app.flower.fastpath import gate
from tests.flower_range import above, below, bound, nightly

ROOT = Path(__file__).resolve().parents[1]


def test_the_range_is_the_flower_requirement_of_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in deps if Requirement(d).name == "flwr")
    assert gate.supported_range() == pin.specifier


def test_the_installed_flower_is_inside_the_range():
    """The environment the tests run in (and CI's second one) has a supported Flower."""
    assert gate.version_problem(env={}) is None


def test_versions_just_outside_the_range_and_a_nightly_build_close_the_gate():
    for version in (above(), below(), nightly()):
        assert gate.version_problem(version, env={}) == (
            f"flwr {version} is outside the supported range {gate.supported_range()}")
    assert gate.version_problem(bound(">="), env={}) is None


@given(st.integers(0, 3), st.integers(0, 60), st.integers(0, 30),
       st.one_of(st.none(), st.integers(1, 99)))
def test_the_gate_admits_exactly_the_versions_of_the_range(major, minor, micro, dev):
    version = f"{major}.{minor}.{micro}" + ("" if dev is None else f".dev{dev}")
    inside = gate.supported_range().contains(Version(version), prereleases=True)
    assert (gate.version_problem(version, env={}) is None) == inside


def test_an_unreadable_version_is_outside():
    assert "outside" in gate.version_problem("not-a-version", env={})


@pytest.mark.parametrize("value", ["off", "0", "false", "NO"])
def test_the_environment_forces_the_gate_closed(value):
    problem = gate.version_problem(bound(">="), env={gate.FORCE_ENV: value})
    assert problem is not None and gate.FORCE_ENV in problem
    assert gate.version_problem(bound(">="), env={gate.FORCE_ENV: "on"}) is None


def test_a_nightly_flower_is_found_under_its_own_distribution_name(monkeypatch):
    def version(name: str) -> str:
        if name == "flwr-nightly":
            return nightly()
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gate.metadata, "version", version)
    assert gate.flower_version() == nightly()


def test_without_fedcure_installed_the_source_trees_pyproject_gives_the_range(monkeypatch):
    def requires(name: str) -> list[str]:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gate.metadata, "requires", requires)
    gate.supported_range.cache_clear()
    try:
        assert str(gate.supported_range()) == str(Requirement(
            f"flwr>={bound('>=')},<{bound('<')}").specifier)
    finally:
        gate.supported_range.cache_clear()


def test_one_warning_line_names_the_version_and_the_fix_only_when_off(monkeypatch):
    monkeypatch.delenv(gate.FORCE_ENV, raising=False)
    quiet = io.StringIO()
    assert gate.warn_if_off("fedcure-edge", quiet) is False and quiet.getvalue() == ""
    monkeypatch.setattr(gate, "flower_version", nightly)
    out = io.StringIO()
    assert gate.warn_if_off("fedcure-edge", out) is True
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedcure-edge: warning: ")
    assert f"Flower {nightly()}, fast path off" in lines[0]
    assert f'pip install "flwr[simulation]{gate.supported_range()}"' in lines[0]


def test_a_patch_that_stays_off_warns_only_while_the_gate_is_open(monkeypatch, caplog):
    log = logging.getLogger("fedcure.test_gate")
    monkeypatch.delenv(gate.FORCE_ENV, raising=False)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        gate.report_off(log, "changed upstream")
        monkeypatch.setenv(gate.FORCE_ENV, "off")
        gate.report_off(log, "gate closed")
    assert [(r.levelno, r.message) for r in caplog.records] == [
        (logging.WARNING, "changed upstream"), (logging.DEBUG, "gate closed")]


def test_fedcure_version_prints_flowers_version_and_the_fast_path(capsys, monkeypatch):
    from fedcure_app.cli import main

    monkeypatch.delenv(gate.FORCE_ENV, raising=False)
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fedcure ")
    assert out[1] == f"Flower {gate.flower_version()}, fast path on"


def test_single_patches_can_be_turned_off_by_name():
    env = {gate.PATCH_OFF_ENV: "held_pulls, quiet_server"}
    version = bound(">=")
    assert "held_pulls" in gate.version_problem(version, env=env, patch="held_pulls")
    assert gate.version_problem(version, env=env, patch="quiet_server") is not None
    assert gate.version_problem(version, env=env, patch="object_pulls") is None
    assert gate.version_problem(version, env=env) is None  # the gate itself stays open
    with pytest.raises(ValueError, match="no fast-path patch"):
        gate.version_problem(version, env=env, patch="no_such_patch")


def test_a_version_free_patch_applies_outside_the_range_and_with_the_gate_forced_closed():
    for patch in gate.VERSION_FREE:
        assert gate.version_problem(above(), env={}, patch=patch) is None
        assert gate.version_problem(env={gate.FORCE_ENV: "off"}, patch=patch) is None
        assert gate.version_problem(env={gate.PATCH_OFF_ENV: patch}, patch=patch) is not None
    others = set(gate.PATCHES) - gate.VERSION_FREE
    assert others and all(gate.version_problem(above(), env={}, patch=p) for p in others)
