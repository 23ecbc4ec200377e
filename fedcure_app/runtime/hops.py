"""The hop table of deployed edge rounds: where an edge round's time goes (pure functions).

Input: the events of :mod:`fedcure_app.runtime.tracing` (``load_events``). Each train message is
followed from the edge ServerApp's push to the edge's pull of its reply; each hop is the time
between two consecutive events on that path (:data:`MESSAGE_HOPS`), and each edge round is
split into the edge's send, the slowest message and the aggregation (:data:`ROUND_HOPS`).
:func:`hop_table` gives the count, median and p95 of every hop (seconds);
:func:`format_table` prints it. A hop whose events are missing (tracing off in that process, a
message that was dropped) is left out for that message, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: (hop, from event, to event) along one train message's path
MESSAGE_HOPS: tuple[tuple[str, str, str], ...] = (
    ("edge push -> SuperNode pull", "edge.push", "sn.receive"),
    ("SuperNode task -> executor", "sn.receive", "exe.acquired"),
    ("executor pulls message+objects", "exe.acquired", "exe.input"),
    ("executor -> trainer", "exe.input", "app.start"),
    ("ClientApp before training", "app.start", "app.train_start"),
    ("training", "app.train_start", "app.train_end"),
    ("ClientApp after training", "app.train_end", "app.end"),
    ("trainer -> executor", "app.end", "exe.push"),
    ("executor push -> SuperNode sees", "exe.push", "sn.sending"),
    ("SuperNode -> SuperLink push", "sn.sending", "sn.sent"),
    ("SuperLink -> edge pull", "sn.sent", "edge.pulled"),
)
#: the per-round parts: the edge's send, the slowest message (push to pull, overlapping the
#: send), the aggregation
ROUND_HOPS = ("edge ServerApp send", "slowest message", "edge aggregates", "round wall",
              "round overhead")
#: events keyed by the reply's id (mapped to the train message's id through ``edge.pulled``)
REPLY_EVENTS = frozenset({"sn.sending", "sn.sent"})


@dataclass(frozen=True)
class HopStats:
    """One hop over many messages or rounds: how many, median and p95 (seconds)."""

    hop: str
    count: int
    median_s: float
    p95_s: float


def stats(name: str, values: Sequence[float]) -> HopStats:
    """Count, median and 95th percentile (linear interpolation) of ``values``; NaN when empty."""
    if not len(values):
        return HopStats(name, 0, float("nan"), float("nan"))
    v = np.asarray(values, dtype=np.float64)
    return HopStats(name, int(v.size), float(np.median(v)), float(np.percentile(v, 95)))


def message_times(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Train message id → {event: time}. Reply-keyed events are filed under the message they
    answer; the first occurrence of an event counts (a retried push is not a second hop)."""
    events = list(events)
    reply_of = {str(e["reply"]): str(e["key"]) for e in events
                if e["ev"] == "edge.pulled" and e.get("reply")}
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for e in events:
        ev = str(e["ev"])
        if ev.startswith("edge.round") or ev == "edge.pushed":
            continue
        key = str(e["key"])
        if ev in REPLY_EVENTS:
            if key not in reply_of:
                continue
            key = reply_of[key]
        out[key].setdefault(ev, float(e["t"]))
    return dict(out)


def message_hops(times: Mapping[str, Mapping[str, float]]) -> dict[str, list[float]]:
    """Hop → its durations (seconds) over every message that has both of its events."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in MESSAGE_HOPS}
    for t in times.values():
        for name, a, b in MESSAGE_HOPS:
            if a in t and b in t:
                out[name].append(t[b] - t[a])
    return out


def round_hops(events: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per complete edge round (``edge.round_start`` and ``edge.round_done`` both seen): the
    edge's send (start to its push returning, objects uploaded), the slowest message (the push
    beginning to the last pull), the
    aggregation (last pull to done), the wall and the overhead (wall less the longest local
    training of that round's messages, where traced)."""
    events = list(events)
    times = message_times(events)
    start: dict[str, float] = {}
    pushed_at: dict[str, float] = {}
    done: dict[str, float] = {}
    members: dict[str, list[str]] = defaultdict(list)
    for e in events:
        if e["ev"] == "edge.round_start":
            start.setdefault(str(e["key"]), float(e["t"]))
        elif e["ev"] == "edge.round_done":
            done.setdefault(str(e["key"]), float(e["t"]))
        elif e["ev"] == "edge.pushed":
            pushed_at.setdefault(str(e["key"]), float(e["t"]))
        elif e["ev"] == "edge.push" and e.get("round") is not None:
            members[str(e["round"])].append(str(e["key"]))
    out: dict[str, list[float]] = {name: [] for name in ROUND_HOPS}
    for r in sorted(set(start) & set(done)):
        msgs = [times[m] for m in members.get(r, []) if m in times]
        pushed = [t["edge.push"] for t in msgs if "edge.push" in t]
        pulled = [t["edge.pulled"] for t in msgs if "edge.pulled" in t]
        wall = done[r] - start[r]
        out["round wall"].append(wall)
        if r in pushed_at:
            out["edge ServerApp send"].append(pushed_at[r] - start[r])
        if pushed and pulled:
            out["slowest message"].append(max(pulled) - min(pushed))
        if pulled:
            out["edge aggregates"].append(done[r] - max(pulled))
        trained = [t["app.train_end"] - t["app.train_start"] for t in msgs
                   if "app.train_start" in t and "app.train_end" in t]
        if trained:
            out["round overhead"].append(wall - max(trained))
    return out


def hop_table(events: Iterable[Mapping[str, Any]]) -> tuple[list[HopStats], list[HopStats]]:
    """(per-message hops, per-round parts), each with count, median and p95."""
    events = list(events)
    per_msg = message_hops(message_times(events))
    per_round = round_hops(events)
    return ([stats(name, per_msg[name]) for name, _, _ in MESSAGE_HOPS],
            [stats(name, per_round[name]) for name in ROUND_HOPS])


def format_table(messages: Sequence[HopStats], rounds: Sequence[HopStats]) -> str:
    """The hop table as fixed-width text (milliseconds)."""
    lines = [f"{'hop (per train message)':36s} {'n':>5s} {'median ms':>10s} {'p95 ms':>9s}"]
    lines.append("-" * len(lines[0]))
    for h in messages:
        lines.append(f"{h.hop:36s} {h.count:5d} {1e3 * h.median_s:10.1f} {1e3 * h.p95_s:9.1f}")
    lines.append("")
    lines.append(f"{'per edge round':36s} {'n':>5s} {'median ms':>10s} {'p95 ms':>9s}")
    lines.append("-" * len(lines[0]))
    for h in rounds:
        lines.append(f"{h.hop:36s} {h.count:5d} {1e3 * h.median_s:10.1f} {1e3 * h.p95_s:9.1f}")
    return "\n".join(lines)


__all__ = ["MESSAGE_HOPS", "REPLY_EVENTS", "ROUND_HOPS", "HopStats", "format_table",
           "hop_table", "message_hops", "message_times", "round_hops", "stats"]
