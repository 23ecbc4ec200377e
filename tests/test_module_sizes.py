"""Small modules with one job (docs/development.md): the size rules, checked with :mod:`ast`.

- no module of ``fedcure_app``, ``cloud_server``, ``edge_server`` or ``client`` is longer than
  :data:`MAX_MODULE_LINES` lines, generated protobuf stubs (``*_pb2*.py``) aside;
- no class there is longer than :data:`MAX_CLASS_LINES` lines (decorators included);
- ``fedcure_app``'s top level holds at most :data:`MAX_TOP_MODULES` modules besides its
  ``__init__``: everything else lives in a package named by its concern.

:data:`KNOWN_LONG` lists the files that break a rule today; each entry must still break it, so
the list only shrinks (delete an entry once its file is split).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedcure_app", "cloud_server", "edge_server", "client")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
MAX_TOP_MODULES = 8

#: Files over a limit today (path relative to the repository root -> why it is still long).
KNOWN_LONG: dict[str, str] = {
}


def _is_generated(path: Path) -> bool:
    return "_pb2" in path.name


def modules(root: Path = ROOT) -> list[Path]:
    """Every hand-written ``.py`` module of the four packages under ``root``."""
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
                  if not _is_generated(p))


def oversized(root: Path = ROOT) -> dict[str, list[str]]:
    """Per file (relative path) what is over a limit: the module's length, each long class."""
    out: dict[str, list[str]] = {}
    for path in modules(root):
        text = path.read_text()
        found = []
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"module of {lines} lines (limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - start + 1
                if length > MAX_CLASS_LINES:
                    found.append(f"class {node.name} of {length} lines (limit {MAX_CLASS_LINES})")
        if found:
            out[path.relative_to(root).as_posix()] = found
    return out


def top_modules(root: Path = ROOT) -> list[str]:
    """The modules at ``fedcure_app``'s top level, ``__init__`` aside."""
    return sorted(p.name for p in (root / "fedcure_app").glob("*.py") if p.name != "__init__.py")


def test_no_module_or_class_is_too_long_but_the_known_ones():
    found = oversized()
    new = {f: why for f, why in found.items() if f not in KNOWN_LONG}
    assert not new, "split these (or their classes):\n" + "\n".join(
        f"{f}: {', '.join(why)}" for f, why in sorted(new.items()))
    gone = sorted(set(KNOWN_LONG) - set(found))
    assert not gone, f"within the limits now: delete them from KNOWN_LONG: {gone}"


def test_the_library_top_level_holds_few_modules():
    top = top_modules()
    assert len(top) <= MAX_TOP_MODULES, (
        f"{len(top)} modules at fedcure_app's top level (at most {MAX_TOP_MODULES}): {top}")


def test_the_checker_counts_modules_and_classes_and_skips_stubs(tmp_path):
    long_class = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES
    for rel, text in {
        "fedcure_app/__init__.py": "",
        "fedcure_app/small.py": "class Fine:\n    pass\n",
        "fedcure_app/big.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
        "cloud_server/deco.py": "@dataclass\n" + long_class[:-len("    x = 1\n")],
        "client/wide.py": long_class,
        "edge_server/cloud_pb2.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
    }.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = oversized(tmp_path)
    assert sorted(found) == ["client/wide.py", "cloud_server/deco.py", "fedcure_app/big.py"]
    assert found["client/wide.py"] == [f"class Big of {MAX_CLASS_LINES + 1} lines "
                                       f"(limit {MAX_CLASS_LINES})"]
    assert top_modules(tmp_path) == ["big.py", "small.py"]
