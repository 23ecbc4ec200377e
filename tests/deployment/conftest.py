import pytest

from tests.deployment.fakes import FakeEdge


@pytest.fixture
def cleanup():
    """Things to stop after the test: servers, edges, channels (anything with stop/close)."""
    items: list = []
    yield items
    for it in reversed(items):
        if isinstance(it, FakeEdge):
            it.close()
        elif hasattr(it, "stop"):
            it.stop()
        else:
            it.close()
