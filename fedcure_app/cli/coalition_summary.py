"""What a deployed run did per coalition, from its ``result.json`` (pure; the summary table of
``fedcure launch`` and ``fedcure testbed`` prints it).

Per coalition m: its clients' devices, its tasks, their mean latency with the coalition's first
task left out (that one pays the trainers' start-up), T̂_m at the end of the run, its share of
the rounds, and per device the mean frequency the cloud directed and the one the clients
applied over those tasks. Seconds and GHz. :func:`demonstrated` says in plain words what the run
showed of the method: the latency spread between coalitions, what formation did, the frequency
directives and what the clients applied, the shares of rounds against their targets, the
accuracy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _by_device(records: Sequence[Mapping[str, Any]], key: str, device: Mapping[int, str]
               ) -> dict[str, float]:
    """Mean of ``record[key]`` (client id → GHz) over ``records``, per device name."""
    seen: dict[str, list[float]] = {}
    for r in records:
        for c, f in (r.get(key) or {}).items():
            name = device.get(int(c))
            if name is not None and f is not None and math.isfinite(float(f)):
                seen.setdefault(name, []).append(float(f))
    return {n: sum(v) / len(v) for n, v in sorted(seen.items())}


def coalition_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per coalition (see the module docstring): ``coalition``, ``devices`` (name →
    count), ``tasks``, ``mean_latency_s`` (None with fewer than two tasks), ``t_hat_s``,
    ``share``, ``directed_ghz`` and ``applied_ghz`` (device name → mean GHz)."""
    clients = result.get("clients") or []
    device = {int(c["id"]): str(c["device"]) for c in clients}
    members: dict[int, list[int]] = {}
    for c in clients:
        members.setdefault(int(c["edge"]), []).append(int(c["id"]))
    records = result.get("records") or []
    t_hat = result.get("latency_estimate_s") or []
    count = len(result.get("coalitions") or members)
    total = max(1, len(records))
    rows = []
    for m in range(count):
        mine = [r for r in records if int(r["coalition"]) == m]
        later = mine[1:]
        lat = [float(r["latency_s"]) - float(r.get("startup_s") or 0.0) for r in later]
        rows.append({
            "coalition": m,
            "devices": dict(sorted(Counter(device[i] for i in members.get(m, [])).items())),
            "tasks": len(mine),
            "mean_latency_s": _mean(lat),
            "t_hat_s": float(t_hat[m]) if m < len(t_hat) and t_hat[m] is not None else None,
            "share": len(mine) / total,
            "directed_ghz": _by_device(later or mine, "frequencies_ghz", device),
            "applied_ghz": _by_device(later or mine, "applied_ghz", device),
        })
    return rows


def latency_spread(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The slowest coalition's mean task latency over the fastest's (None with fewer than two
    coalitions that have one)."""
    lat = [r["mean_latency_s"] for r in rows if r["mean_latency_s"]]
    return max(lat) / min(lat) if len(lat) >= 2 else None


def devices_text(devices: Mapping[str, int]) -> str:
    """``rpi4, rpi5×3``."""
    return ", ".join(n if k == 1 else f"{n}×{k}" for n, k in devices.items()) or "-"


def ghz_text(per_device: Mapping[str, float]) -> str:
    """``rpi4 1.50, rpi5 1.95``."""
    return ", ".join(f"{n} {f:.2f}" for n, f in per_device.items()) or "-"


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f} %"


def _busy(result: Mapping[str, Any]) -> bool:
    """The run warned that the host was busy (latencies then need not follow the profiles)."""
    return any("busy" in str(w.get("detail", "")) for w in result.get("warnings") or [])


def demonstrated(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What the run showed, one (topic, plain sentence) per row: ``latency spread``,
    ``formation``, ``directives``, ``scheduling`` and ``learning``; a topic the run has no
    figures for says so."""
    rows = coalition_rows(result)
    out: list[tuple[str, str]] = []
    timed = [r for r in rows if r["mean_latency_s"]]
    if len(timed) >= 2:
        slow = max(timed, key=lambda r: r["mean_latency_s"])
        fast = min(timed, key=lambda r: r["mean_latency_s"])
        text = (f"coalition {slow['coalition']} ({devices_text(slow['devices'])}) took "
                f"{slow['mean_latency_s'] / fast['mean_latency_s']:.2f}× as long per task as "
                f"coalition {fast['coalition']} ({devices_text(fast['devices'])}); a task "
                "lasts as long as its slowest client's part")
        if _busy(result):
            text += " (this host was busy: latencies need not follow the profiles)"
    else:
        text = "too few tasks per coalition to compare their latencies"
    out.append(("latency spread", text))
    form = result.get("formation") or {}
    first, last = form.get("initial_assignment"), form.get("assignment")
    if result.get("initial_jsd") is not None and first and last:
        moved = sum(1 for a, b in zip(first, last) if a != b)
        out.append(("formation", f"{moved} of {len(last)} clients moved to another edge "
                    f"server; the label mixes of the coalitions grew alike (JSD "
                    f"{result['initial_jsd']:.3f} → {result['formed_jsd']:.3f} nats)"))
    else:
        out.append(("formation", "none: every client trained with its initial edge server"))
    records = result.get("records") or []
    device = {int(c["id"]): str(c["device"]) for c in result.get("clients") or []}
    directed = _by_device(records, "frequencies_ghz", device)
    applied = _by_device(records, "applied_ghz", device)
    if directed:
        pairs = ", ".join(f"{n} {f:.2f} → " + (f"{applied[n]:.2f}" if n in applied else "-")
                          for n, f in directed.items())
        out.append(("directives", "the cloud set a CPU frequency for every client of every "
                    f"task, and the clients ran at it (mean GHz directed → applied: {pairs})"))
    else:
        out.append(("directives", "no task was sent"))
    part = result.get("participation") or {}
    share, delta = part.get("share"), part.get("delta")
    if share and delta:
        out.append(("scheduling", "shares of the rounds " + ", ".join(
            f"{s:.2f}" for s in share) + " against the targets δ " + ", ".join(
            f"{d:.2f}" for d in delta) + " (each coalition's share of the data)"))
    first_acc = result.get("initial_accuracy")
    out.append(("learning", f"test accuracy {_pct(first_acc)} → "
                f"{_pct(result.get('final_accuracy'))} in {result.get('rounds')} global "
                "rounds"))
    return out


__all__ = ["coalition_rows", "demonstrated", "devices_text", "ghz_text", "latency_spread"]
