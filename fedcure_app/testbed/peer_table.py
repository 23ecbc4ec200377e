"""Time to a target accuracy, read the same way off every method's run (pure).

A run is its evaluated global models in order: records ``{"time_s", "accuracy", ...}`` with
``time_s`` the wall-clock seconds from the first dispatch to the aggregation that made the model
(FedCure's cloud: round 0's dispatch; Flower's FedAvg: round 1's) and ``accuracy`` the central
test accuracy in [0, 1] (None: not evaluated). The global model between two aggregations is the
last one made, so a run's accuracy at time t is a step function, and its time to a target is
the first aggregation whose model reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: the target is this fraction of the better method's final accuracy unless given
TARGET_FRACTION = 0.9


def evaluated(records: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(time_s, accuracy) of every evaluated record, in time order."""
    return sorted((float(r["time_s"]), float(r["accuracy"])) for r in records
                  if r.get("accuracy") is not None)


def time_to_target(records: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """Seconds to the first evaluated model with accuracy >= ``target``; None if none is."""
    return next((t for t, a in evaluated(records) if a >= target), None)


def accuracy_at(records: Sequence[Mapping[str, Any]], t: float) -> float | None:
    """Accuracy of the last model evaluated at or before ``t`` seconds; None before the first."""
    before = [a for s, a in evaluated(records) if s <= t]
    return before[-1] if before else None


def final_accuracy(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Accuracy of the last evaluated model; None when none was evaluated."""
    found = evaluated(records)
    return found[-1][1] if found else None


def target_accuracy(finals: Sequence[float | None], given: float | None = None,
                    fraction: float = TARGET_FRACTION) -> float:
    """``given``, else ``fraction`` × the best of the final accuracies (ValueError if none)."""
    if given is not None:
        return float(given)
    known = [f for f in finals if f is not None]
    if not known:
        raise ValueError("no run evaluated a model: no target accuracy")
    return fraction * max(known)


def comparison(runs: Mapping[str, Mapping[str, Any]], target: float | None = None
               ) -> dict[str, Any]:
    """The table of ``runs`` (method -> ``{"records", "rounds", "client_steps"}``): per method
    its time to the target, final accuracy, accuracy at the shorter run's end, wall seconds,
    rounds and client steps; and the target itself."""
    finals = {m: final_accuracy(r["records"]) for m, r in runs.items()}
    goal = target_accuracy(list(finals.values()), target)
    ends = {m: max((float(x["time_s"]) for x in r["records"]), default=0.0)
            for m, r in runs.items()}
    common = min(ends.values(), default=0.0)
    rows = [{"method": m, "time_to_target_s": time_to_target(r["records"], goal),
             "final_accuracy": finals[m],
             "accuracy_at_common_s": accuracy_at(r["records"], common),
             "wall_seconds": ends[m], "rounds": int(r["rounds"]),
             "client_steps": int(r["client_steps"])} for m, r in runs.items()]
    return {"target_accuracy": goal, "common_s": common, "rows": rows}


def _pct(x: float | None) -> str:
    return "never" if x is None else f"{100 * x:.1f} %"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(table: Mapping[str, Any]) -> str:
    """:func:`comparison`'s table as Markdown; with ``mean_clientapp_s`` and ``mean_train_s``
    in the rows, a column of each train message's mean seconds: ClientApp start to reply, and
    of those the training."""
    timed = all("mean_clientapp_s" in r for r in table["rows"])
    head = ("| method | time to target | final accuracy | accuracy at "
            f"{table['common_s']:.0f} s | wall s | rounds | client steps |"
            + (" s per train message (training) |" if timed else ""))
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" * timed)]
    for r in table["rows"]:
        ttt = r["time_to_target_s"]
        lines.append(f"| {r['method']} | {'never' if ttt is None else f'{ttt:.0f} s'} | "
                     f"{_pct(r['final_accuracy'])} | {_pct(r['accuracy_at_common_s'])} | "
                     f"{r['wall_seconds']:.0f} | {r['rounds']} | {r['client_steps']} |"
                     + (f" {_seconds(r['mean_clientapp_s'])} ({_seconds(r['mean_train_s'])}) |"
                        if timed else ""))
    lines.append(f"\ntarget: {_pct(table['target_accuracy'])} of test accuracy")
    return "\n".join(lines) + "\n"


__all__ = ["TARGET_FRACTION", "accuracy_at", "comparison", "evaluated", "final_accuracy",
           "markdown", "target_accuracy", "time_to_target"]
