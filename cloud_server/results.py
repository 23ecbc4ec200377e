"""The run's result (``result.json``), final model and plots: :class:`ResultsWriter`.

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

from fedcure_app.config import FedCureConfig
from fedcure_app.trained.files import run_task
from fedcure_app.trained.names import by_name, last_class_accuracy, run_classes
from cloud_server.checkpoint import CheckpointStore
from cloud_server.reach import max_shares
from cloud_server.state import Federation, Roster, RunLog

log = logging.getLogger("fedcure.cloud")


class ResultsWriter:
    """The run's summary, and the files it is written to.

    Parameters
    ----------
    cfg:
        The configuration (copied into the result).
    out_dir:
        Where ``result.json``, ``final_model.safetensors`` and the plots go (None: nothing is
        written).
    write_plots:
        Write the PNG plots too.
    evaluation:
        How the global model is evaluated: ``central`` (a test set at the cloud, or none) or
        ``federated`` (on the clients' held-out parts, :mod:`cloud_server.fedeval`); the
        result's ``evaluation`` key.
    """

    def __init__(self, cfg: FedCureConfig, out_dir: str | Path | None = None,
                 write_plots: bool = True, evaluation: str = "central") -> None:
        if evaluation not in ("central", "federated"):
            raise ValueError(f"evaluation must be central or federated, got {evaluation!r}")
        self.cfg = cfg
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.write_plots = write_plots
        self.evaluation = evaluation

    def summary(self, federation: Federation, roster: Roster, run: RunLog,
                checkpoints: CheckpointStore | None) -> dict[str, Any]:
        """The run's result dict, the engine's summary keys where they apply (call holding the
        controller's lock: it reads the strategy and copies the records)."""
        strategy = federation.strategy
        records = [dict(r) for r in run.records]
        part = strategy.participation.copy()
        share = part / max(1, part.sum())
        lat = np.array([r["latency_s"] for r in records])
        try:
            reach = max_shares(strategy.estimator.mean(), strategy.max_concurrent).tolist()
        except ValueError:
            reach = None
        accs = [r["accuracy"] for r in records if r["accuracy"] is not None]
        m = roster.num_edges
        assignment = federation.assignment
        coalitions = [np.flatnonzero(assignment == e).tolist() for e in range(m)]
        jsd = federation.jsd
        cfg = self.cfg
        return {
            "config": cfg.model_dump(mode="json", by_alias=True),
            "mode": "deployment",
            "complete": len(records) >= cfg.run.global_rounds,
            # a task's run names no built-in dataset ("task", as the simulation's result does)
            "dataset": cfg.data.dataset if cfg.task is None else "task",
            # federated: the accuracies are the clients' sample-weighted ones on their held-out
            # parts; each evaluated record also says how many clients and samples answered
            "evaluation": self.evaluation,
            "initial_accuracy": run.initial_accuracy,
            "initial_evaluation": run.initial_evaluation,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            # the last evaluation's per-class accuracy, keyed by class name
            "class_accuracy_by_name": by_name(last_class_accuracy(records),
                                              run_classes(cfg)),
            "rounds": len(records),
            "wall_seconds": records[-1]["time_s"] if records else 0.0,
            "energy_j": float(sum(r["energy_j"] for r in records)),
            "latency_cov": float(lat.std() / lat.mean()) if lat.size and lat.mean() > 0 else 0.0,
            "coalitions": coalitions,
            "initial_jsd": jsd[0] if jsd else None,
            "formed_jsd": jsd[1] if jsd else None,
            "formation": {
                "rule": cfg.method.formation,
                "initial_assignment": np.asarray(federation.initial_assignment).tolist(),
                "assignment": np.asarray(assignment).tolist(),
                "moves": federation.formation.get("moves"),
                "stable": federation.formation.get("stable"),
            },
            # T̂_m at the end of the run (s): what the cloud expects each coalition's next task
            # to take
            "latency_estimate_s": [float(x) for x in strategy.estimator.mean()],
            "participation": {
                "rounds": part.tolist(),
                "share": share.tolist(),
                "delta": np.asarray(strategy.delta).tolist(),
                # upper bound on each coalition's share given K and the latency estimates
                "max_share": reach,
            },
            "warnings": list(run.warnings),
            "late_rounds": sum(1 for r in records if r.get("late")),
            "clients": [
                {"id": c.client_id, "name": c.name, "edge": c.edge_id, "home_edge": c.home_edge,
                 "device": c.profile.name, "samples": c.samples,
                 # where it trained, and its measured rate (samples/s; None: not measured)
                 "compute_device": c.compute_device,
                 "samples_per_s": c.samples_per_s or None,
                 # ε of the noise on its label histogram (None: exact counts)
                 "histogram_epsilon": c.histogram_epsilon or None}
                for c in roster.by_id()
            ],
            # clients that withdrew or were refused before formation, and why
            "withdrawn": dict(roster.withdrawn),
            "edges": {str(e): a for e, a in roster.edge_addresses.items()},
            "final_version": strategy.version,
            "faults": list(run.faults),
            "checkpoints": None if checkpoints is None else {
                "dir": str(checkpoints.dir), "writes": checkpoints.writes,
                "seconds": checkpoints.seconds},
            "records": records,
        }

    def write(self, result: dict[str, Any], final_model: bytes | None,
              arrays: list[np.ndarray] | None = None) -> None:
        """``result`` as ``result.json``, ``final_model`` (safetensors bytes) as
        ``final_model.safetensors``, the global model ``arrays`` as the run folder's model
        files (``model.pt``, ``model.pt2``, ``task.toml``: :mod:`fedcure_app.trained.files`,
        written before ``result.json``) and the plots, into ``out_dir`` (nothing without
        one)."""
        if self.out_dir is None:
            return
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        if arrays is not None:
            from fedcure_app.trained.files import model_info, write_model_files

            try:
                write_model_files(out, arrays, run_task(self.cfg),
                                  model_info("fedcure-cloud", result))
            except Exception as err:  # noqa: BLE001 - the result is still written
                log.warning("the model files (model.pt, model.pt2) were not written: %s: %s",
                            type(err).__name__, err)
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "result.json")
        if final_model is not None:
            (out / "final_model.safetensors").write_bytes(final_model)
        if self.write_plots:
            # lazy on purpose: matplotlib costs the cloud's start-up a second or more, and
            # only the end of a run needs it
            from fedcure_app.run_plots import write_run_plots

            try:
                write_run_plots(result, out)  # wall-clock axes; title names both rules
            except Exception:  # noqa: BLE001 - plots are a convenience
                log.exception("writing the plots failed")


__all__ = ["ResultsWriter"]
