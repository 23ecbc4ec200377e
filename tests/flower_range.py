"""Flower versions just outside FedCure's supported range, derived from the range itself (the
``flwr`` requirement in pyproject.toml), so no test names a version as "unsupported" by hand."""

from __future__ import annotations

from fedcure_app.flower.fastpath.gate import supported_range


def bound(operator: str) -> str:
    """The version of the range's specifier with ``operator`` (``<`` or ``>=``)."""
    spec = supported_range()
    assert spec is not None, "FedCure's requirement on Flower cannot be read"
    return next(s.version for s in spec if s.operator == operator)


def above() -> str:
    """The first release past the range: its ``<`` bound, as a full version (e.g. 1.43.0)."""
    return f"{bound('<')}.0"


def nightly() -> str:
    """A nightly build of the first minor past the range (``flwr-nightly``'s versions)."""
    return f"{bound('<')}.0.dev20260101"


def below() -> str:
    """The last patch release of the minor before the range's ``>=`` bound."""
    major, minor = (int(p) for p in bound(">=").split(".")[:2])
    return f"{major}.{minor - 1}.99"
