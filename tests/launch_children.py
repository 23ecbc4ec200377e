"""A stand-in for ``fedcure launch``'s child processes, for tests of what it starts."""

from __future__ import annotations

from typing import Any


def record_children(monkeypatch: Any) -> list[Any]:
    """Replace the launch's process starts: every child it would start is recorded (``name``,
    ``argv``) in the returned list, nothing runs, and the launch waits for no port."""
    import fedcure_app.runtime.processes
    from fedcure_app.cli import launch

    started: list[Any] = []

    class Child:
        def __init__(self, name: str, argv: list[str], **_kw: Any) -> None:
            self.name, self.argv, self.pid = name, argv, 1
            started.append(self)

    monkeypatch.setattr(fedcure_app.runtime.processes, "Child", Child)
    monkeypatch.setattr(launch, "_wait_listening", lambda *a, **k: None)
    monkeypatch.setattr(launch, "wait_edge_ready", lambda *a, **k: None)
    return started
