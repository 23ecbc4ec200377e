"""Hop tracing of a deployed edge round: timestamped events, one JSON line each.

When ``FEDCURE_TRACE_DIR`` names a folder, every process on a message's path appends events to
``<dir>/<role>-<pid>.jsonl``: the edge ServerApp (:mod:`fedcure_app.flower.edge`), the SuperNode
(:mod:`client.supernode`, through Flower's own log lines), the warm executor
(:mod:`client.executor`) and the trainer's ClientApp (:mod:`fedcure_app.flower.client_app`). Without
the variable :func:`trace` returns at once and writes nothing. :mod:`fedcure_app.runtime.hops` turns
the events into the hop table.

An event is ``{"t": epoch seconds, "ev": name, "key": the train message's id, ...}``; events that
concern a whole edge round are keyed by ``<task id>/e<edge round>``. All processes of a
benchmark share one host clock (``time.time``).

Event names (in path order):

- ``edge.round_start`` (round key), ``edge.push`` (message id; ``round``, ``node``; ``t``: when
  the push began: the SuperLink lists a message before its objects are uploaded),
  ``edge.pushed`` (round key: messages and objects uploaded), ``edge.pulled`` (message id;
  ``reply``: the reply's id, reply and its objects pulled from the SuperLink),
  ``edge.round_done`` (round key; aggregated);
- ``sn.receive`` (message id: the SuperNode's pull from the SuperLink returned it), ``sn.received``
  (its objects pulled too), ``sn.sending`` (reply id: the SuperNode found the reply),
  ``sn.sent`` (reply id: reply and objects pushed to the SuperLink);
- ``exe.acquired`` (message id, ``t`` = when the executor's AcquireTask returned), ``exe.input``
  (message and context pulled from the SuperNode), ``exe.push`` (pushing the reply to the
  SuperNode begins);
- ``app.start`` / ``app.train_start`` / ``app.train_end`` / ``app.end`` (message id: the
  ClientApp's train handler, its local training inside it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, TextIO

#: the environment variable naming the trace folder
TRACE_ENV = "FEDCURE_TRACE_DIR"

_lock = threading.Lock()
_file: TextIO | None = None
_file_key: tuple[str, int] | None = None
_role = "proc"


def enabled() -> bool:
    """True when ``FEDCURE_TRACE_DIR`` is set (events are written)."""
    return bool(os.environ.get(TRACE_ENV))


def set_role(role: str) -> None:
    """Name this process's trace file ``<role>-<pid>.jsonl`` (before its first event)."""
    global _role
    _role = re.sub(r"[^A-Za-z0-9_.-]", "_", role) or "proc"


def trace(event: str, key: str, t: float | None = None, **fields: Any) -> None:
    """Append one event (``t``: epoch seconds, default now) when tracing is on."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return
    global _file, _file_key
    row = {"t": time.time() if t is None else float(t), "ev": event, "key": str(key), **fields}
    line = json.dumps(row, separators=(",", ":")) + "\n"
    with _lock:
        pid = os.getpid()
        if _file is None or _file_key != (folder, pid):  # first event, or a forked child
            Path(folder).mkdir(parents=True, exist_ok=True)
            _file = open(Path(folder) / f"{_role}-{pid}.jsonl", "a", buffering=1)
            _file_key = (folder, pid)
        _file.write(line)


class FlowerLogTracer(logging.Handler):
    """Turns the SuperNode's own log lines into ``sn.*`` events: Flower logs ``Receiving: ...
    (ID: m)`` when its pull returned a message, ``Received successfully`` once the objects are
    in, ``Sending: ... (ID: r)`` when it found the reply and ``Sent successfully`` once the
    reply is pushed. One message at a time (the SuperNode's loop is sequential)."""

    _ID = re.compile(r"\(ID: ([0-9a-f]+)\)")

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self._receiving = ""
        self._sending = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a log line that does not format is not ours
            return
        if text.startswith("Receiving:"):
            m = self._ID.search(text)
            self._receiving = m.group(1) if m else ""
            trace("sn.receive", self._receiving, t=record.created)
        elif text.startswith("Received successfully") and self._receiving:
            trace("sn.received", self._receiving, t=record.created)
        elif text.startswith("Sending:"):
            m = self._ID.search(text)
            self._sending = m.group(1) if m else ""
            trace("sn.sending", self._sending, t=record.created)
        elif text.startswith("Sent successfully") and self._sending:
            trace("sn.sent", self._sending, t=record.created)


def trace_flower_log(logger_name: str = "flwr") -> FlowerLogTracer | None:
    """Attach a :class:`FlowerLogTracer` to Flower's logger when tracing is on."""
    if not enabled():
        return None
    handler = FlowerLogTracer()
    logging.getLogger(logger_name).addHandler(handler)
    return handler


def load_events(folder: str | Path) -> list[dict[str, Any]]:
    """Every event in ``folder``'s ``*.jsonl`` files, with ``proc`` (the file's stem), by time.
    A line cut short (a process killed mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "t" in row and "ev" in row and "key" in row:
                row["proc"] = path.stem
                events.append(row)
    events.sort(key=lambda e: float(e["t"]))
    return events


__all__ = ["TRACE_ENV", "FlowerLogTracer", "enabled", "load_events", "set_role", "trace",
           "trace_flower_log"]
