"""The cloud is objects that own their state, not one object spread over mixins (docs/DESIGN.md,
"The cloud"): every module is parsed with :mod:`ast`, nothing is imported.

- no class in ``cloud_server/`` has more than one *project* base class, a base being "project"
  when it is defined in ``cloud_server/``, ``fedcure_app/``, ``edge_server/`` or ``client/``
  (names followed through imports, re-exports and module aliases such as ``pb_grpc.X``);
- no class there declares attributes without giving them a value (the mixin's ``strategy: Any``
  stubs for what another class sets), dataclasses and typing records aside, and no comment
  lists what a class expects of another (``# attributes of CloudController used here``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.test_import_directions import Module, collect_modules

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("cloud_server", "fedcure_app", "edge_server", "client")
CLOUD = "cloud_server"
#: records whose annotated fields are the point (no value needed)
RECORD_BASES = {"NamedTuple", "TypedDict", "Protocol"}
#: comments that hand a class a list of what another class must provide
CONTRACT_COMMENT = re.compile(r"#\s*(?:(?:attributes|methods)\s+of\s+[A-Z]\w*|of\s+[A-Z]\w*\s*:)")


class Tree:
    """The project's modules with, per module, its classes and what its names are bound to."""

    def __init__(self, root: Path) -> None:
        self.modules: dict[str, Module] = collect_modules(root, PROJECT)
        self.parsed = {n: ast.parse(m.path.read_text(), filename=str(m.path))
                       for n, m in self.modules.items()}
        self.classes = {n: {c.name for c in ast.walk(t) if isinstance(c, ast.ClassDef)}
                        for n, t in self.parsed.items()}
        self.names = {n: self._bindings(self.modules[n], t) for n, t in self.parsed.items()}

    @staticmethod
    def _bindings(mod: Module, tree: ast.Module) -> dict[str, str]:
        """Local name -> the dotted thing it names (``pkg.mod`` or ``pkg.mod.Name``)."""
        out: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        top = a.name.partition(".")[0]
                        out[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    out[a.asname or a.name] = f"{base}.{a.name}"
        return out

    def defined_in_project(self, dotted: str, depth: int = 0) -> bool:
        """``pkg.mod.Name`` is a class defined in a project module (re-exports followed)."""
        module, _, name = dotted.rpartition(".")
        if module not in self.modules or depth > 10:
            return False
        if name in self.classes[module]:
            return True
        target = self.names[module].get(name)
        return target is not None and self.defined_in_project(target, depth + 1)

    def resolve(self, module: str, expr: ast.expr) -> str | None:
        """The dotted name a base-class expression refers to, seen from ``module``."""
        if isinstance(expr, ast.Subscript):  # Mapping[int, Slot]
            return self.resolve(module, expr.value)
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        if not parts and expr.id in self.classes[module] and expr.id not in self.names[module]:
            return f"{module}.{expr.id}"
        head = self.names[module].get(expr.id, expr.id)
        return ".".join([head, *parts])

    def project_bases(self, module: str, cls: ast.ClassDef) -> list[str]:
        """The bases of ``cls`` that are project classes."""
        out = []
        for base in cls.bases:
            dotted = self.resolve(module, base)
            if dotted is not None and self.defined_in_project(dotted):
                out.append(dotted)
        return out


def mixed_classes(root: Path) -> list[str]:
    """``module.Class: base, base`` for each class in cloud_server/ with > 1 project base."""
    tree = Tree(root)
    bad = []
    for name, parsed in tree.parsed.items():
        if name.partition(".")[0] != CLOUD:
            continue
        for cls in (n for n in ast.walk(parsed) if isinstance(n, ast.ClassDef)):
            bases = tree.project_bases(name, cls)
            if len(bases) > 1:
                bad.append(f"{name}.{cls.name}: {', '.join(bases)}")
    return bad


def _is_record(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, (ast.Name, ast.Attribute)) and (
                getattr(target, "id", None) == "dataclass"
                or getattr(target, "attr", None) == "dataclass"):
            return True
    return any(getattr(b, "id", getattr(b, "attr", None)) in RECORD_BASES for b in cls.bases)


def expected_attributes(root: Path) -> list[str]:
    """Bare class-level annotations (no value) outside records, and contract comments, in
    cloud_server/: what one class declares for another to provide."""
    bad = []
    for path in sorted((root / CLOUD).rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(root)
        for cls in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)):
            if _is_record(cls):
                continue
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
                    bad.append(f"{rel}:{stmt.lineno}: {cls.name} declares "
                               f"{ast.unparse(stmt.target)} without setting it")
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and CONTRACT_COMMENT.search(tok.string):
                bad.append(f"{rel}:{tok.start[0]}: {tok.string.strip()}")
    return bad


# ------------------------------------------------------------------------------ the cloud
def test_no_cloud_class_has_more_than_one_project_base():
    assert mixed_classes(ROOT) == []


def test_no_cloud_class_declares_attributes_another_class_sets():
    assert expected_attributes(ROOT) == []


# ------------------------------------------------------------------------------ the checks
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_mixins_through_imports_aliases_and_re_exports(tmp_path):
    _write(tmp_path, {
        "fedcure_app/__init__.py": "",
        "fedcure_app/grpc_stubs.py": "class Servicer(object):\n    pass\n",
        "fedcure_app/shim.py": "from fedcure_app.grpc_stubs import Servicer\n",
        "cloud_server/__init__.py": "",
        "cloud_server/steps.py": "class Steps:\n    pass\n\nclass Writer:\n    pass\n",
        "cloud_server/svc.py": (
            "from collections.abc import Mapping\n"
            "from fedcure_app import grpc_stubs as stubs\n"
            "from fedcure_app.shim import Servicer\n"
            "from .steps import Steps, Writer\n"
            "class Local:\n    pass\n"
            "class Mixed(Steps, Writer):\n    pass\n"
            "class Served(stubs.Servicer, Local):\n    pass\n"
            "class ReExported(Servicer, Steps):\n    pass\n"
            "class Fine(Mapping[int, Steps], Steps):\n    pass\n"
            "class Plain(dict):\n    pass\n"),
    })
    assert sorted(mixed_classes(tmp_path)) == [
        "cloud_server.svc.Mixed: cloud_server.steps.Steps, cloud_server.steps.Writer",
        "cloud_server.svc.ReExported: fedcure_app.shim.Servicer, cloud_server.steps.Steps",
        "cloud_server.svc.Served: fedcure_app.grpc_stubs.Servicer, cloud_server.svc.Local",
    ]


def test_the_check_finds_attribute_stubs_and_contract_comments(tmp_path):
    _write(tmp_path, {
        "cloud_server/__init__.py": "",
        "cloud_server/a.py": (
            "from dataclasses import dataclass\n"
            "from typing import Any, NamedTuple\n"
            "class Steps:\n"
            "    # attributes of CloudController used here\n"
            "    strategy: Any\n"
            "    limit: int = 3\n"
            "@dataclass\n"
            "class Row:\n    x: int\n"
            "class Pair(NamedTuple):\n    a: int\n"
            "class Handlers:\n"
            "    # of CloudService: edges, strategy\n"
            "    pass\n"),
    })
    found = expected_attributes(tmp_path)
    assert len(found) == 3, found
    assert "Steps declares strategy without setting it" in found[0]
    assert all("Row" not in f and "Pair" not in f for f in found)
