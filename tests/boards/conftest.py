"""The arm64 tests run last: ``.ci/run`` prepares the arm64 tree in the background while the
rest of the suite runs (``docker/arm64/prepare.sh`` takes a lock, so the tests' own call waits
for that preparation and then finds the tree ready)."""

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
