"""The arm64 tests run last, so that a ``docker/arm64/prepare.sh`` started in the background
before the suite (it takes a lock; the tests' own call waits for it and then finds the tree
ready) has the rest of the suite's time to finish."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move this folder's tests after every other test (stable otherwise)."""
    def here(item: pytest.Item) -> bool:
        return HERE in Path(str(item.path)).resolve().parents

    items[:] = [i for i in items if not here(i)] + [i for i in items if here(i)]
