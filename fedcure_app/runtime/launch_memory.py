"""How many clients one machine can start: ``fedcure launch --clients-data`` starts one
``fedcure-client`` per entry, and each brings its SuperNode, its warm executor and trainer
(torch, the model, the data) and a one-off data child. Measured on this project's machine
(``fedcure launch --task … --clients-data`` with 12 entries): 60 processes, 8.1 GB of summed
RSS, about 0.68 GB per client with the cloud's and the edges' share. :data:`CLIENT_BYTES`
rounds that up; the launch refuses more entries than the available memory holds at that rate,
in one line naming the estimate, unless ``--max-clients`` raises the cap.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the memory one launched client is estimated to take, bytes (0.68 GB measured, rounded up)
CLIENT_BYTES = 700 * 2**20


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The memory available for new processes (Linux ``MemAvailable``), else the machine's
    physical memory."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def memory_cap(available: int, per_client: int = CLIENT_BYTES) -> int:
    """The clients ``available`` bytes hold at ``per_client`` each (at least 1)."""
    return max(1, int(available) // int(per_client))


def clients_refusal(entries: int, available: int, max_clients: int | None,
                    per_client: int = CLIENT_BYTES) -> str | None:
    """Why ``entries`` clients cannot be launched, in one line (None when they can): more
    than ``max_clients`` when it is given, else more than :func:`memory_cap` of
    ``available``."""
    gib = 2**30
    if max_clients is not None:
        if entries <= max_clients:
            return None
        return (f"--clients-data holds {entries} entries, more than --max-clients "
                f"{max_clients}")
    cap = memory_cap(available, per_client)
    if entries <= cap:
        return None
    return (f"--clients-data holds {entries} entries: about {entries * per_client / gib:.1f} GiB "
            f"at ~{per_client / gib:.2f} GiB a client (its SuperNode, executor and trainer), "
            f"more than the {available / gib:.1f} GiB available here (room for {cap}); launch "
            f"fewer, or raise the cap with --max-clients {entries}")


__all__ = ["CLIENT_BYTES", "available_bytes", "clients_refusal", "memory_cap"]
