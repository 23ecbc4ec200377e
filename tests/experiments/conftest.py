"""Shared fixtures: run torch on one thread inside a test, restoring the process setting after."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_thread():
    """One torch thread (much faster on a busy 2-core box); restored afterwards."""
    import torch

    from fedcure_app import training

    threads, configured = torch.get_num_threads(), training._threads_configured
    training.configure_threads(1)
    yield
    torch.set_num_threads(threads)
    training._threads_configured = configured
