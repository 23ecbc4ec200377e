"""The SuperNode imports no SQLAlchemy, and Flower's SQL object store still works when asked for
(:mod:`fedcure_app.flower.fastpath.lazy_sql`). Each case runs in a fresh interpreter: the stand-in
has to be in place before Flower is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fedcure_app.flower.fastpath.lazy_sql import defer_sql_object_store
from tests.flower_range import above, below

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> dict:
    """The JSON object the last line of ``code``'s output holds (fresh interpreter)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_supernode_imports_leave_sqlalchemy_and_alembic_out() -> None:
    """Everything the SuperNode imports (its CLI and its loop) loads without SQLAlchemy or
    Alembic once the stand-in is in place, and its in-memory object store is Flower's own."""
    got = _run(
        "import sys, json\n"
        "from fedcure_app.flower.fastpath.lazy_sql import defer_sql_object_store\n"
        "deferred = defer_sql_object_store()\n"
        "import client.supernode\n"
        "from flwr.supernode.cli.flower_supernode import flower_supernode\n"
        "import flwr.supernode.start_client_internal\n"
        "from flwr.supercore.object_store import ObjectStoreFactory\n"
        "store = ObjectStoreFactory().store()\n"
        "print(json.dumps({'deferred': deferred, 'store': type(store).__name__,\n"
        "  'loaded': [m for m in ('sqlalchemy', 'alembic') if m in sys.modules]}))")
    assert got == {"deferred": True, "store": "InMemoryObjectStore", "loaded": []}


def test_a_database_path_still_gets_flowers_sql_store() -> None:
    """A factory given a database (here SQLite in memory) gets the real ``SqlObjectStore``,
    which stores and returns an object, and later calls use the real class directly."""
    got = _run(
        "import sys, json\n"
        "from fedcure_app.flower.fastpath.lazy_sql import defer_sql_object_store, SQL_MODULE\n"
        "defer_sql_object_store()\n"
        "from flwr.supercore.object_store import ObjectStoreFactory\n"
        "import flwr.supercore.object_store.object_store_factory as fac\n"
        "before = 'sqlalchemy' in sys.modules\n"
        "store = ObjectStoreFactory(':memory:').store()\n"
        "from flwr.supercore.object_store.sql_object_store import SqlObjectStore\n"
        "print(json.dumps({'before': before, 'after': 'sqlalchemy' in sys.modules,\n"
        "  'real': isinstance(store, SqlObjectStore), 'factory_real': fac.SqlObjectStore is\n"
        "  SqlObjectStore, 'module': type(sys.modules[SQL_MODULE]).__name__}))")
    assert got == {"before": False, "after": True, "real": True, "factory_real": True,
                   "module": "module"}


def test_other_flower_versions_and_a_loaded_module_are_left_alone() -> None:
    """Outside the pinned range, or once the real module is loaded, nothing is replaced."""
    assert defer_sql_object_store(version=above()) is False
    assert defer_sql_object_store(version=below()) is False
    got = _run(
        "import json, sys\n"
        "import flwr.supercore.object_store.sql_object_store as real\n"
        "from fedcure_app.flower.fastpath.lazy_sql import defer_sql_object_store, SQL_MODULE\n"
        "print(json.dumps({'deferred': defer_sql_object_store(),\n"
        "  'same': sys.modules[SQL_MODULE] is real}))")
    assert got == {"deferred": False, "same": True}
