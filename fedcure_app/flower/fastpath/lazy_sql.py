"""The SuperNode without SQLAlchemy: Flower's SQL object store is loaded only if it is used.

Flower 1.41's SuperNode keeps its objects in memory (``ObjectStoreFactory()`` with the
in-memory name, ``flwr.supernode.cli.flower_supernode``), yet
``flwr.supercore.object_store.object_store_factory`` imports ``SqlObjectStore`` at module level,
and with it SQLAlchemy and Alembic: about 23 MB of a client's SuperNode that nothing uses
(``bench/footprint.py``). :func:`defer_sql_object_store`, called before Flower is imported, puts
a stand-in module in that module's place whose ``SqlObjectStore`` imports the real module on its
first call and returns the real store: a factory given a database path gets exactly what it got
before, a moment later.

Only a Flower inside the fast path's gate (:mod:`fedcure_app.flower.fastpath.gate`) is changed,
and only when the real module has not been imported yet; otherwise nothing changes
(:func:`defer_sql_object_store` says why). ``tests/deployment/test_lazy_sql.py`` fails when
Flower changes underneath.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType
from typing import Any

from fedcure_app.flower.fastpath.gate import version_problem

log = logging.getLogger("fedcure.lazy_sql")

#: the Flower module that loads SQLAlchemy and Alembic when imported
SQL_MODULE = "flwr.supercore.object_store.sql_object_store"
#: the factory module that imports :data:`SQL_MODULE` at module level
FACTORY_MODULE = "flwr.supercore.object_store.object_store_factory"


def load_real() -> ModuleType:
    """Import Flower's real SQL object-store module (replacing the stand-in) and point the
    factory module at its ``SqlObjectStore``."""
    if isinstance(sys.modules.get(SQL_MODULE), _StandIn):
        del sys.modules[SQL_MODULE]
    module = importlib.import_module(SQL_MODULE)
    factory = sys.modules.get(FACTORY_MODULE)
    if factory is not None:
        factory.SqlObjectStore = module.SqlObjectStore  # type: ignore[attr-defined]
    return module


class _LazySqlObjectStore:
    """Stands in for ``SqlObjectStore``: calling it loads the real class and returns its
    instance (so ``__init__`` of this class never runs)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        log.info("loading Flower's SQL object store (SQLAlchemy) on first use")
        return load_real().SqlObjectStore(*args, **kwargs)


class _StandIn(ModuleType):
    """The stand-in for :data:`SQL_MODULE`: ``SqlObjectStore`` is :class:`_LazySqlObjectStore`;
    any other attribute loads the real module."""

    SqlObjectStore = _LazySqlObjectStore

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(load_real(), name)


def defer_sql_object_store(version: str | None = None) -> bool:
    """Put the stand-in in place of :data:`SQL_MODULE` (before Flower is imported); False,
    with the reason logged at debug level, when the fast path's gate is closed or the
    module is already loaded."""
    problem = version_problem(version, patch="lazy_sql")
    if problem is None and SQL_MODULE in sys.modules:
        problem = f"{SQL_MODULE} is already imported"
    if problem is not None:
        log.debug("Flower's SQL object store is imported as usual: %s", problem)
        return False
    sys.modules[SQL_MODULE] = _StandIn(SQL_MODULE, __doc__)
    return True
