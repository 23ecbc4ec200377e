"""What a configuration file changes: its knobs whose values differ from the defaults of
:class:`~fedcure_app.config.FedCureConfig`, the one source of defaults that ``fedcure
simulate``, ``fedcure launch``, the roles and the Flower app share. ``fedcure-cloud --config
FILE`` logs them at start-up (a compose file's settings never change a run unsaid)."""

from __future__ import annotations

from typing import Any

from fedcure_app.config import FedCureConfig, flat_keys


def changed_knobs(cfg: FedCureConfig) -> list[str]:
    """``key value (default D)`` for every flat configuration key of ``cfg`` whose value differs
    from the default, in :func:`~fedcure_app.config.flat_keys` order."""
    default = FedCureConfig()
    out = []
    for key, (section, name) in flat_keys().items():
        mine, theirs = (getattr(getattr(c, section), name) for c in (cfg, default))
        if mine != theirs:
            out.append(f"{key} {_shown(mine)} (default {_shown(theirs)})")
    return out


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["changed_knobs"]
