"""The one version gate of the fast path: is the installed Flower one its patches were written for?

The supported range is not written here: it is the ``flwr`` requirement of the installed
``fedcure`` distribution (``pyproject.toml``'s ``flwr[simulation]>=…,<…``, read back through
:mod:`importlib.metadata`), or of the source tree's ``pyproject.toml`` when FedCure runs from a
checkout that is not installed. Flower is looked up under both of its distribution names,
``flwr`` and ``flwr-nightly``. Every patch of the fast path asks :func:`version_problem`; the
command lines print :func:`summary` (``fedcure --version``, ``fedcure launch``) or
:func:`warn_if_off` (``fedcure-edge``, ``fedcure-client``): one line naming the version and how to
get the fast path back.

``FEDCURE_FASTPATH=off`` in the environment closes the gate whatever the version (every role a
launch starts inherits it): FedCure then runs Flower unchanged, at stock Flower's speed.
``FEDCURE_FASTPATH_OFF=name,name`` turns single patches off (their names: :data:`PATCHES`), to
measure what each one gains.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: the environment variable that forces the fast path off ("off", "0", "false", "no")
FORCE_ENV = "FEDCURE_FASTPATH"
#: the names Flower is published under (releases, nightly builds)
FLOWER_DISTRIBUTIONS = ("flwr", "flwr-nightly")
#: the distribution whose requirement on Flower is the supported range
FEDCURE_DISTRIBUTION = "fedcure"
#: the environment variable naming patches to leave off (comma-separated names of PATCHES)
PATCH_OFF_ENV = "FEDCURE_FASTPATH_OFF"
#: every patch's name, as each asks :func:`version_problem` (fastpath/__init__.py lists them)
PATCHES = ("object_pulls", "held_pulls", "lazy_sql", "object_batches", "message_batches",
           "task_batches", "quiet_server", "buffered_middleware", "idle_clock")
#: patches whose own check is complete whatever the version, so they apply outside the range
#: too: ``object_pulls`` only passes keyword arguments the wrapped function's signature is
#: checked to take (a Flower that renames or drops one keeps its own waits)
VERSION_FREE = frozenset({"object_pulls"})
_OFF_VALUES = frozenset({"off", "0", "false", "no"})


def flower_version() -> str:
    """The installed Flower's version, under whichever distribution name it came."""
    for name in FLOWER_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    import flwr  # installed some other way (a source tree on sys.path)

    return str(getattr(flwr, "__version__", "0"))


def _flower_requirement(lines: list[str]) -> SpecifierSet | None:
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name in FLOWER_DISTRIBUTIONS and not req.marker:
            return req.specifier
    return None


def _source_tree_lines() -> list[str]:
    import tomllib

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return list(data.get("project", {}).get("dependencies", []))


@functools.lru_cache(maxsize=1)
def supported_range() -> SpecifierSet | None:
    """The Flower versions the fast path supports, from FedCure's own requirement on Flower
    (None when neither the installed distribution nor the source tree declares one)."""
    try:
        lines = metadata.requires(FEDCURE_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        lines = []
    return _flower_requirement(lines) or _flower_requirement(_source_tree_lines())


def forced_off(env: dict[str, str] | None = None) -> bool:
    """True when ``FEDCURE_FASTPATH`` turns the fast path off."""
    value = (os.environ if env is None else env).get(FORCE_ENV, "")
    return value.strip().lower() in _OFF_VALUES


def version_problem(version: str | None = None, supported: SpecifierSet | str | None = None,
                    env: dict[str, str] | None = None, patch: str | None = None) -> str | None:
    """Why the fast path (or its patch named ``patch``) must stay off for Flower ``version``
    (default: the installed one), or None when the version is in ``supported`` (default:
    :func:`supported_range`) and the environment does not turn it off: the one check every
    patch makes. A :data:`VERSION_FREE` patch answers to ``FEDCURE_FASTPATH_OFF`` only."""
    if patch is not None:
        if patch not in PATCHES:
            raise ValueError(f"no fast-path patch is named {patch!r}")
        off = (os.environ if env is None else env).get(PATCH_OFF_ENV, "")
        if patch in {p.strip() for p in off.split(",")}:
            return f"the patch {patch} is turned off ({PATCH_OFF_ENV} in the environment)"
        if patch in VERSION_FREE:
            return None
    if forced_off(env):
        return f"the fast path is turned off ({FORCE_ENV} in the environment)"
    version = flower_version() if version is None else version
    spec = supported_range() if supported is None else SpecifierSet(str(supported))
    if spec is None:
        return "FedCure's requirement on Flower cannot be read (fedcure is not installed)"
    try:
        inside = spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        inside = False
    return None if inside else f"flwr {version} is outside the supported range {spec}"


def report_off(logger: logging.Logger, text: str, *args: Any) -> None:
    """Log that a patch stays off: a warning when the gate is open (the code it replaces has
    changed: worth a look), at debug level when the gate is closed (the command line said so
    once, in one line, for every patch)."""
    level = logging.WARNING if version_problem() is None else logging.DEBUG
    logger.log(level, text, *args)


def fast_path_on() -> bool:
    """True when every patch may apply (each still checks the code it replaces)."""
    return version_problem() is None


def remedy() -> str:
    """How to get the fast path: the command that installs a supported Flower."""
    if forced_off():
        return f"unset {FORCE_ENV}"
    spec = supported_range()
    return f'pip install "flwr[simulation]{spec}"' if spec else "pip install -e . (FedCure)"


def summary() -> str:
    """One line: the Flower version and whether the fast path is on (why not, and the fix)."""
    problem = version_problem()
    if problem is None:
        return f"Flower {flower_version()}, fast path on"
    return (f"Flower {flower_version()}, fast path off: {problem}; Flower runs unpatched "
            f"(edge rounds of a few seconds); for the fast path: {remedy()}")


def warn_if_off(prog: str, stream: IO[str] | None = None) -> bool:
    """Print ``prog: warning: <summary>`` on ``stream`` (stderr) when the fast path is off;
    True when it printed."""
    if version_problem() is None:
        return False
    print(f"{prog}: warning: {summary()}", file=sys.stderr if stream is None else stream,
          flush=True)
    return True


__all__ = ["FEDCURE_DISTRIBUTION", "FLOWER_DISTRIBUTIONS", "FORCE_ENV", "PATCHES",
           "PATCH_OFF_ENV", "VERSION_FREE", "fast_path_on",
           "flower_version", "forced_off", "remedy", "report_off", "summary", "supported_range",
           "version_problem", "warn_if_off"]
