"""What ``fedcure-edge`` hands its ServerApp: one JSON file named by the run config's ``edge-file``.

The ServerApp runs in a ``flwr-serverapp`` process that Flower starts, so it cannot take command
line flags; ``fedcure-edge`` writes this file (mode 0600: it holds the token) into its work
directory and puts its path in the generated app's run config.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


class SettingsError(ValueError):
    """A missing or malformed edge settings file (one line)."""


@dataclass(frozen=True)
class EdgeSettings:
    """The edge ServerApp's settings (addresses ``host:port``, times in seconds)."""

    cloud: str
    edge_id: int
    #: the SuperLink address the cloud gives to this ES's clients
    advertise: str
    token: str = ""
    insecure: bool = False
    #: CA (PEM) to verify the cloud with; client certificate/key for mutual TLS
    tls_ca: str | None = None
    cloud_cert: str | None = None
    cloud_key: str | None = None
    #: fedcure-edge's pid: the ServerApp exits when it is gone
    parent_pid: int | None = None
    #: the ServerApp's log file (fedcure-edge shows it) and its final status file
    log_file: str | None = None
    status_file: str | None = None
    #: how long a task waits for its clients' SuperNodes to show up
    discovery_timeout_s: float = 300.0
    #: per edge round reply deadline (None: wait for every client)
    edge_timeout_s: float | None = None
    #: seconds between reply pulls
    poll_s: float = 0.01
    #: how long to keep reconnecting to (or re-submitting to) a cloud that went away before
    #: giving up, seconds: it bounds the partitions and cloud restarts an edge rides out
    reconnect_timeout_s: float = 300.0

    def save(self, path: str | Path) -> Path:
        """Write the settings as JSON, readable by the owner only."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=1)
        return p

    @classmethod
    def load(cls, path: str | Path) -> "EdgeSettings":
        """Read a settings file; :class:`SettingsError` when missing or malformed."""
        p = Path(path)
        try:
            data: dict[str, Any] = json.loads(p.read_text())
        except FileNotFoundError:
            raise SettingsError(f"edge settings file {p} not found") from None
        except (OSError, json.JSONDecodeError) as err:
            raise SettingsError(f"edge settings file {p} is not readable JSON: {err}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"edge settings file {p}: unknown keys {unknown}")
        try:
            return cls(**data)
        except TypeError as err:
            raise SettingsError(f"edge settings file {p}: {err}") from None


__all__ = ["EdgeSettings", "SettingsError"]
