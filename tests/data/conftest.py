"""Keep every data test off the user's cache and data directories."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """User cache under a temporary XDG_CACHE_HOME; no cache or data-dir overrides."""
    xdg = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.delenv("FEDCURE_CACHE_DIR", raising=False)
    monkeypatch.delenv("FEDCURE_DATA_DIR", raising=False)
    return xdg
