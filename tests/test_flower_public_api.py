"""Outside the fast path, FedCure imports Flower's public API only (docs/DESIGN.md, "The fast
path"): ``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp`` and ``flwr.common``. Every patch of
Flower's private code lives in ``fedcure_app.flower.fastpath``, behind its one version gate.

Every module of the four packages is parsed with :mod:`ast` (nothing is imported); every
``import flwr...`` / ``from flwr... import`` counts, at module top and inside functions alike.
:data:`KNOWN_PRIVATE` lists the modules that still reach past the public API, each with why; each
must still do so (the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedcure_app", "cloud_server", "edge_server", "client")
PUBLIC = ("flwr.app", "flwr.serverapp", "flwr.clientapp", "flwr.common")
FASTPATH = "fedcure_app.flower.fastpath"

#: modules outside the fast path that import private Flower names today, and why
KNOWN_PRIVATE: dict[str, str] = {
    "client.executor": "the warm executor replaces flwr-clientapp on Flower's Runtime API "
                       "(task pull, heartbeats, SuperExec auth): no public API offers it",
    "client.runtime_client": "the executor's HTTP client for the SuperNode's Runtime API",
    "fedcure_app.flower.run": "Flower's public run_simulation hands every app an empty run "
                              "config; the internal _run_simulation takes one",
}


def flower_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every Flower module ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "flwr":
                found += [(node.lineno, f"flwr.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return sorted((line, m) for line, m in found if m == "flwr" or m.startswith("flwr."))


def is_public(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PUBLIC)


def private_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """Per module outside the fast path: its imports of private Flower modules."""
    out: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            name = name.removesuffix(".__init__")
            if name == FASTPATH or name.startswith(FASTPATH + "."):
                continue
            bad = [f"{m} (line {line})" for line, m in flower_imports(path) if not is_public(m)]
            if bad:
                out[name] = bad
    return out


def test_outside_the_fast_path_only_flowers_public_api_is_imported():
    found = private_imports()
    new = {m: v for m, v in found.items() if m not in KNOWN_PRIVATE}
    assert not new, f"private Flower imports outside {FASTPATH}: {new}"


def test_every_known_exception_still_imports_private_flower():
    stale = [m for m in KNOWN_PRIVATE if m not in private_imports()]
    assert not stale, f"delete these entries of KNOWN_PRIVATE: {stale}"


def test_the_scan_sees_private_imports_wherever_they_are(tmp_path: Path):
    pkg = tmp_path / "client"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text("from flwr.app import Message\nimport flwr.common.constant\n")
    (pkg / "bad.py").write_text("def f():\n    from flwr.supernode import start_client_internal\n"
                                "from flwr import superlink\n")
    assert private_imports(tmp_path) == {
        "client.bad": ["flwr.supernode (line 2)", "flwr.superlink (line 3)"]}
