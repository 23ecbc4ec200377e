"""Imports point down only (docs/DESIGN.md, "Import directions").

Every module of the four packages is parsed with :mod:`ast` (nothing is imported), and every
``import``/``from ... import`` in it counts, at module top, inside functions and under
``TYPE_CHECKING`` alike. The rules:

- the library ``fedcure_app`` never imports a role (``cloud_server``, ``edge_server``, ``client``);
- no role imports another role;
- a role does not import a driver (``fedcure_app.simulation``, ``.experiments``, ``.cli``);
- no module imports a private (leading underscore) name or module from another package;
- ``fedcure_app.core`` imports only the standard library, numpy, scipy and scikit-learn;
- Flower (``flwr``) is imported in the library only by ``fedcure_app.flower`` and the drivers,
  and ``fedcure_app.flower`` is imported in the library only by the drivers: the method, the
  data, the devices and the runtime plumbing know nothing of Flower;
- ``fedcure_app.runtime`` (processes, threads, tracing) imports no other first-party module;
- no import cycle between modules, except the ones listed in :data:`KNOWN_CYCLES`, each of which
  must still exist (so the list shrinks as they are removed).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = "fedcure_app"
ROLES = ("cloud_server", "edge_server", "client")
DRIVERS = ("fedcure_app.simulation", "fedcure_app.experiments", "fedcure_app.cli",
           "fedcure_app.flower.run")
#: The Flower run-config module: the simulation builds its federation without it
#: (fedcure_app.federation is the one builder; docs/DESIGN.md).
FLOWER_CONFIG = "fedcure_app.flower.app_config"
SIMULATION = "fedcure_app.simulation"
#: Everything that uses Flower's APIs (``flwr``) in the library.
FLOWER = "fedcure_app.flower"
#: Process plumbing under everything else: child processes, thread policy, tracing.
RUNTIME = "fedcure_app.runtime"
CORE = "fedcure_app.core"
CORE_MAY_IMPORT = frozenset({"numpy", "scipy", "sklearn"})

#: Import cycles that exist today, with the work that removes them. A cycle not listed here
#: fails the test, and so does a listed one that is gone (delete its entry).
KNOWN_CYCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. "fedcure_app.core.queues"
    path: Path
    is_package: bool  # an __init__.py

    @property
    def package(self) -> str:
        """The package the module belongs to (itself for an ``__init__``)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (first-party: resolved to a module of the tree)
    name: str | None  # the imported name for ``from target import name`` (None: a module)
    line: int

    def where(self) -> str:
        what = self.target if self.name is None else f"{self.target}.{self.name}"
        return f"{self.source} (line {self.line}) imports {what}"


def collect_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Module]:
    """Every ``.py`` module under ``root/<package>`` for the given top-level packages."""
    out: dict[str, Module] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            out[".".join(parts)] = Module(".".join(parts), path, is_package)
    return out


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def import_edges(modules: dict[str, Module]) -> list[Edge]:
    """Every import statement of every module, relative imports resolved.

    ``from a.b import c`` is an import of module ``a.b.c`` when that module exists in the tree,
    else of the name ``c`` from module ``a.b``.
    """
    edges: list[Edge] = []
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(), filename=str(mod.path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.extend(Edge(mod.name, a.name, None, node.lineno) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in modules:
                        edges.append(Edge(mod.name, full, None, node.lineno))
                    else:
                        edges.append(Edge(mod.name, base, a.name, node.lineno))
    return edges


def _top(name: str) -> str:
    return name.partition(".")[0]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_driver(name: str) -> bool:
    return any(_within(name, d) for d in DRIVERS)


def direction_violations(modules: dict[str, Module], edges: list[Edge]) -> list[str]:
    """One line per import that breaks a direction, privacy or purity rule."""
    bad: list[str] = []
    for e in edges:
        src, dst = _top(e.source), _top(e.target)
        if src == LIBRARY and dst in ROLES:
            bad.append(f"library imports a role: {e.where()}")
        if src in ROLES and dst in ROLES and src != dst:
            bad.append(f"a role imports another role: {e.where()}")
        if src in ROLES and _is_driver(e.target):
            bad.append(f"a role imports a driver: {e.where()}")
        if _within(e.source, SIMULATION) and _within(e.target, FLOWER_CONFIG):
            bad.append(f"the simulation imports the Flower run config: {e.where()}")
        if (_top(e.source) == LIBRARY and _top(e.target) == "flwr"
                and not _within(e.source, FLOWER) and not _is_driver(e.source)):
            bad.append(f"Flower imported outside fedcure_app.flower: {e.where()}")
        if (_top(e.source) == LIBRARY and _within(e.target, FLOWER)
                and not _within(e.source, FLOWER) and not _is_driver(e.source)):
            bad.append(f"fedcure_app.flower imported outside it and the drivers: {e.where()}")
        if (_within(e.source, RUNTIME) and _top(e.target) in (LIBRARY, *ROLES)
                and not _within(e.target, RUNTIME)):
            bad.append(f"runtime imports the project: {e.where()}")
        if _within(e.source, CORE) and not _within(e.target, CORE):
            top = _top(e.target)
            if top not in sys.stdlib_module_names and top not in CORE_MAY_IMPORT:
                bad.append(f"core imports beyond numpy/scipy/scikit-learn: {e.where()}")
        if e.target in modules or _top(e.target) in (LIBRARY, *ROLES):
            target_pkg = (e.target if e.target in modules and modules[e.target].is_package
                          else e.target.rpartition(".")[0])
            if target_pkg == modules[e.source].package:
                continue
            if e.name is not None and _is_private(e.name):
                bad.append(f"private name from another package: {e.where()}")
            elif any(_is_private(p) for p in e.target.split(".")):
                bad.append(f"private module from another package: {e.where()}")
    return bad


def import_cycles(modules: dict[str, Module], edges: list[Edge]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if e.target in modules and e.target != e.source:
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


@pytest.fixture(scope="module")
def project() -> tuple[dict[str, Module], list[Edge]]:
    modules = collect_modules(ROOT, (LIBRARY, *ROLES))
    return modules, import_edges(modules)


def test_the_tree_is_found(project):
    modules, edges = project
    for name in ("fedcure_app.strategy", "fedcure_app.core.queues", "cloud_server.service",
                 "edge_server.superlink", "client.cli"):
        assert name in modules
    assert any(e.source == "cloud_server.controller" and e.target == "fedcure_app.strategy"
               for e in edges)


def test_imports_point_down_only(project):
    modules, edges = project
    bad = direction_violations(modules, edges)
    assert not bad, "imports that point the wrong way:\n" + "\n".join(bad)


def test_the_federation_has_one_builder(project):
    modules, edges = project
    assert "fedcure_app.simulation.flower_run" not in modules
    assert not [e.where() for e in edges
                if _within(e.source, SIMULATION) and _within(e.target, FLOWER_CONFIG)]
    from fedcure_app import federation
    from fedcure_app.flower import app_config

    assert callable(federation.partition_for) and callable(federation.profiles_for)
    assert not hasattr(app_config, "partition_for") and not hasattr(app_config, "profiles_for")


def test_no_import_cycles_but_the_known_ones(project):
    modules, edges = project
    found = import_cycles(modules, edges)
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"these cycles are gone: delete them from KNOWN_CYCLES: {gone}"


# ----------------------------------------------------------------- the checker on a toy tree
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_checker_reports_every_kind_of_wrong_arrow(tmp_path):
    _write(tmp_path, {
        "fedcure_app/__init__.py": "",
        "fedcure_app/tools.py": "def helper():\n    from edge_server.run import go\n",
        "fedcure_app/simulation/__init__.py": "",
        "fedcure_app/simulation/plots.py": "def _draw(): ...\n",
        "fedcure_app/core/__init__.py": "",
        "fedcure_app/core/pure.py": "import numpy\nimport torch\nfrom . import _checks\n",
        "fedcure_app/core/_checks.py": "",
        "edge_server/__init__.py": "",
        "edge_server/run.py": "def go(): ...\ndef _bin(): ...\n",
        "client/__init__.py": "",
        "client/cli.py": "from edge_server.run import _bin\n",
        "cloud_server/__init__.py": "",
        "cloud_server/service.py": ("from fedcure_app.simulation.plots import _draw\n"
                                    "from fedcure_app.core._checks import x\n"),
    })
    modules = collect_modules(tmp_path, (LIBRARY, *ROLES))
    bad = direction_violations(modules, import_edges(modules))
    assert any(b.startswith("library imports a role: fedcure_app.tools (line 2)") for b in bad)
    assert any(b.startswith("a role imports another role: client.cli") for b in bad)
    assert any(b.startswith("private name from another package: client.cli") for b in bad)
    assert any(b.startswith("a role imports a driver: cloud_server.service") for b in bad)
    assert any(b.startswith("private name from another package: cloud_server.service")
               for b in bad)
    assert any(b.startswith("private module from another package: cloud_server.service")
               for b in bad)
    assert any("core imports beyond" in b and "torch" in b for b in bad)
    # numpy and a private module of core's own package are fine
    assert not any(f"fedcure_app.core.pure (line {n})" in b for n in (1, 3) for b in bad)
    assert len(bad) == 7, bad


def test_checker_keeps_flower_in_its_package_and_the_runtime_below_all(tmp_path):
    _write(tmp_path, {
        "fedcure_app/__init__.py": "",
        "fedcure_app/training.py": "import flwr\n",
        "fedcure_app/strategy.py": "from fedcure_app.flower.edge import run\n",
        "fedcure_app/flower/__init__.py": "",
        "fedcure_app/flower/edge.py": ("from flwr.serverapp import Grid\n"
                                       "from fedcure_app.runtime.tracing import trace\n"),
        "fedcure_app/simulation/__init__.py": "",
        "fedcure_app/simulation/flower_executor.py": ("from flwr.app import Message\n"
                                                      "from fedcure_app.flower.edge import run\n"),
        "fedcure_app/runtime/__init__.py": "",
        "fedcure_app/runtime/tracing.py": "import json\nfrom fedcure_app import training\n",
    })
    modules = collect_modules(tmp_path, (LIBRARY,))
    bad = direction_violations(modules, import_edges(modules))
    assert any(b.startswith("Flower imported outside fedcure_app.flower: fedcure_app.training")
               for b in bad)
    assert any(b.startswith("fedcure_app.flower imported outside it and the drivers: "
                            "fedcure_app.strategy") for b in bad)
    assert any(b.startswith("runtime imports the project: fedcure_app.runtime.tracing (line 2)")
               for b in bad)
    assert len(bad) == 3, bad  # the Flower package and a driver may use Flower


def test_checker_finds_cycles_through_lazy_and_relative_imports(tmp_path):
    _write(tmp_path, {
        "cloud_server/__init__.py": "",
        "cloud_server/a.py": "from . import b\n",
        "cloud_server/b.py": "def f():\n    from cloud_server.c import g\n",
        "cloud_server/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    import cloud_server.a\n",
        "cloud_server/d.py": "import cloud_server.a\n",
    })
    modules = collect_modules(tmp_path, ("cloud_server",))
    found = import_cycles(modules, import_edges(modules))
    assert found == [frozenset({"cloud_server.a", "cloud_server.b", "cloud_server.c"})]
