"""The run's result (``result.json``), final model and plots, built from the controller's state
(part of :class:`cloud_server.controller.CloudController`).

The keys follow the simulation engine's summary where they apply (``mode`` says
``deployment``); plots come from :mod:`fedcure_app.run_plots`, the one place that draws a
run for both the simulation and the cloud.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.protocol.codec import encode_arrays
from cloud_server.reach import max_shares

log = logging.getLogger("fedcure.cloud")


class ResultsWriter:
    """``summary()`` and ``write_results()`` of a :class:`CloudController`."""

    # attributes of CloudController used here
    cfg: Any
    lock: Any
    strategy: Any
    records: list[dict[str, Any]]
    num_edges: int
    assignment: Any
    initial_assignment: Any
    formation: Any
    clients: dict[str, Any]
    jsd_pair: tuple[float, float] | None
    initial_accuracy: float | None
    warnings: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    edge_addresses: dict[int, str]
    checkpoints: Any
    out_dir: Path | None
    write_plots: bool

    def summary(self) -> dict[str, Any]:
        """The run's result dict: the engine's summary keys where they apply."""
        strategy = self.strategy
        assert strategy is not None
        with self.lock:
            records = [dict(r) for r in self.records]
            part = strategy.participation.copy()
        share = part / max(1, part.sum())
        lat = np.array([r["latency_s"] for r in records])
        try:
            with self.lock:
                reach = max_shares(strategy.estimator.mean(), strategy.max_concurrent).tolist()
        except ValueError:
            reach = None
        accs = [r["accuracy"] for r in records if r["accuracy"] is not None]
        m = self.num_edges
        assert self.assignment is not None and self.initial_assignment is not None
        coalitions = [np.flatnonzero(self.assignment == e).tolist() for e in range(m)]
        by_id = sorted(self.clients.values(), key=lambda c: c.client_id or 0)
        jsd = self.jsd_pair
        return {
            "config": self.cfg.model_dump(mode="json", by_alias=True),
            "mode": "deployment",
            "complete": len(records) >= self.cfg.run.global_rounds,
            "dataset": self.cfg.data.dataset,
            "initial_accuracy": self.initial_accuracy,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "rounds": len(records),
            "wall_seconds": records[-1]["time_s"] if records else 0.0,
            "energy_j": float(sum(r["energy_j"] for r in records)),
            "latency_cov": float(lat.std() / lat.mean()) if lat.size and lat.mean() > 0 else 0.0,
            "coalitions": coalitions,
            "initial_jsd": jsd[0] if jsd else None,
            "formed_jsd": jsd[1] if jsd else None,
            "formation": {
                "rule": self.cfg.method.formation,
                "initial_assignment": np.asarray(self.initial_assignment).tolist(),
                "assignment": np.asarray(self.assignment).tolist(),
                "moves": getattr(self.formation, "moves", None),
                "stable": getattr(self.formation, "stable", None),
            },
            "participation": {
                "rounds": part.tolist(),
                "share": share.tolist(),
                "delta": np.asarray(strategy.delta).tolist(),
                # upper bound on each coalition's share given K and the latency estimates
                "max_share": reach,
            },
            "warnings": list(self.warnings),
            "late_rounds": sum(1 for r in records if r.get("late")),
            "clients": [
                {"id": c.client_id, "name": c.name, "edge": c.edge_id, "home_edge": c.home_edge,
                 "device": c.profile.name, "samples": int(c.label_counts.sum())}
                for c in by_id
            ],
            "edges": {str(e): a for e, a in self.edge_addresses.items()},
            "final_version": strategy.version,
            "faults": list(self.faults),
            "checkpoints": None if self.checkpoints is None else {
                "dir": str(self.checkpoints.dir), "writes": self.checkpoints.writes,
                "seconds": self.checkpoints.seconds},
            "records": records,
        }

    def write_results(self) -> dict[str, Any]:
        """:meth:`summary`, written as ``result.json`` with ``final_model.safetensors`` and the
        plots into ``out_dir`` (nothing written without one); returns the summary."""
        result = self.summary()
        if self.out_dir is None:
            return result
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "result.json")
        with self.lock:
            blob = encode_arrays(self.strategy.global_arrays,
                                 {"version": str(self.strategy.version),
                                  "rounds": str(len(self.records))})
        (out / "final_model.safetensors").write_bytes(blob)
        if self.write_plots:
            # lazy on purpose: matplotlib costs the cloud's start-up a second or more, and
            # only the end of a run needs it
            from fedcure_app.run_plots import write_run_plots

            try:
                write_run_plots(result, out)  # wall-clock axes; title names both rules
            except Exception:  # noqa: BLE001 - plots are a convenience
                log.exception("writing the plots failed")
        return result
