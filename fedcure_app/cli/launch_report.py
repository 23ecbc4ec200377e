"""``fedcure launch``'s report: the Flower line (version, fast path on or off), the summary and per-coalition tables, the warnings it logged
added to ``result.json``, and the one-line failure."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any


def summary_table(result: dict[str, Any], command: str = "launch",
             extra: list[tuple[str, str]] | None = None) -> Any:
    from rich.table import Table

    t = Table(title=f"FedCure deployment (fedcure {command})", show_header=False)
    acc, best = result.get("final_accuracy"), result.get("best_accuracy")
    t.add_row("rounds", str(result.get("rounds")))
    where = " (federated)" if result.get("evaluation") == "federated" else ""
    t.add_row("final accuracy", "-" if acc is None else f"{100 * acc:.2f} %{where}")
    t.add_row("best accuracy", "-" if best is None else f"{100 * best:.2f} %")
    from fedcure_app.trained.names import class_rows

    for label, value in class_rows(result):
        t.add_row(label, value)
    t.add_row("coalitions", str(result.get("coalitions")))
    if result.get("initial_jsd") is not None:
        moves = (result.get("formation") or {}).get("moves")
        t.add_row("JSD initial → formed",
                  f"{result['initial_jsd']:.4f} → {result['formed_jsd']:.4f}"
                  + ("" if moves is None else f" ({moves} moves)"))
    t.add_row("wall time", f"{result.get('wall_seconds', 0.0):.1f} s")
    t.add_row("energy", f"{result.get('energy_j', 0.0):.1f} J")
    for label, value in extra or []:
        t.add_row(label, value)
    t.add_row("warnings", str(len(result.get("warnings") or [])))
    return t


def coalition_table(result: dict[str, Any]) -> Any:
    """Per coalition: devices, mean task latency (its first task left out), T̂ at the end,
    share of rounds, mean frequencies directed and applied per device."""
    from rich.table import Table

    from fedcure_app.cli.coalition_summary import (
        coalition_rows,
        devices_text,
        ghz_text,
        latency_spread,
    )

    rows = coalition_rows(result)
    spread = latency_spread(rows)
    t = Table(title="coalitions" + ("" if spread is None else
                                    f" (slowest/fastest mean latency {spread:.2f}×)"))
    for col in ("", "devices", "tasks", "mean latency s", "T̂ end s", "share",
                "directed GHz", "applied GHz"):
        t.add_column(col, justify="left" if col in ("devices", "directed GHz", "applied GHz")
                     else "right")
    for r in rows:
        lat, th = r["mean_latency_s"], r["t_hat_s"]
        t.add_row(str(r["coalition"]), devices_text(r["devices"]), str(r["tasks"]),
                  "-" if lat is None else f"{lat:.2f}", "-" if th is None else f"{th:.2f}",
                  f"{r['share']:.2f}", ghz_text(r["directed_ghz"]), ghz_text(r["applied_ghz"]))
    return t


def demonstrated_table(result: dict[str, Any]) -> Any:
    """What the run showed, in plain words (:func:`~fedcure_app.cli.coalition_summary.
    demonstrated`)."""
    from rich.table import Table

    from fedcure_app.cli.coalition_summary import demonstrated

    t = Table(title="what this run demonstrates", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for topic, text in demonstrated(result):
        t.add_row(topic, text)
    return t


class WarningLines(logging.Handler):
    """Every warning this process logs while attached (its message, one line each)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(" ".join(record.getMessage().split()))
        except Exception:  # noqa: BLE001 - a bad format string must not end the run
            pass


def print_flower(console: Any) -> None:
    """One line: the Flower version and whether the fast path is on; a warning (with how to
    get the fast path) when it is off."""
    from rich.markup import escape

    from fedcure_app.flower.fastpath.gate import fast_path_on, summary

    line = escape(summary())
    console.print(line if fast_path_on() else f"[yellow]warning: {line}[/yellow]",
                  soft_wrap=True, highlight=False)


def add_warnings(result_path: Path, lines: list[str], command: str) -> dict[str, Any]:
    """Append ``lines`` (warnings printed by ``fedcure <command>``) to ``result.json``'s
    ``warnings``, each ``{"kind": command, "detail": line}``; return the result."""
    result = json.loads(result_path.read_text())
    if lines:
        result.setdefault("warnings", []).extend(
            {"kind": command, "detail": line} for line in lines)
        tmp = result_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(result_path)
    return result


def report_failure(out: Path, reason: str, code: int, tail: str,
                    command: str = "launch") -> int:
    """Print why the run failed (one line, then the cloud log's tail if any); the exit code."""
    print(f"fedcure {command}: error: {reason}; logs in {out / 'logs'}"
          + (f"\ncloud log ends with:\n{tail}" if tail else ""), file=sys.stderr)
    return code if code else 1
