"""Client names of own data: the name a client goes by in logs, ``result.json``, coalitions and
the live view.

A client entry of a clients folder (``--clients-data DIR``) is named after its folder, or its
file without the ``.csv``/``.npz`` suffix (``client-00.csv`` is ``client-00``): ``fedcure
simulate`` lists its clients by these names and ``fedcure launch`` starts each client with
``--name`` set to it, so both runs name (and order) the same clients alike. A client started by
hand without ``--name`` takes a name that stays the same across runs (:func:`default_name`).
No NumPy here: the long-lived ``fedcure-client`` process imports this.
"""

from __future__ import annotations

import socket
from pathlib import Path

#: the file suffixes a client entry's name drops
ENTRY_SUFFIXES = (".csv", ".npz")


def client_name(entry: str | Path) -> str:
    """The name of client entry ``entry``: its folder's name, or its file's without the
    ``.csv``/``.npz`` suffix."""
    p = Path(entry)
    return p.stem if p.suffix.lower() in ENTRY_SUFFIXES else p.name


def default_name(data: str | None = None, partition_id: int | None = None,
                 host: str | None = None) -> str:
    """A hand-started client's name without ``--name``: the host's name, then its data's
    (``--data PATH``: :func:`client_name` of PATH) or its partition (``p<id>``) when it has
    one. The same device with the same data keeps its name (and so its client id) from run to
    run, and two clients on one host with different data or partitions differ."""
    name = host or socket.gethostname() or "client"
    if data:
        return f"{name}-{client_name(Path(data).expanduser().resolve())}"
    if partition_id is not None:
        return f"{name}-p{partition_id}"
    return name


__all__ = ["ENTRY_SUFFIXES", "client_name", "default_name"]
