"""The simulation engine's live view: the same page and ``/metrics`` as the cloud's, fed from
:class:`~fedcure_app.simulation.engine.SimulationEngine` on its simulated clock.

``fedcure simulate --dashboard HOST:PORT`` makes a :class:`SimulationFeed`, serves it with
:class:`~fedcure_app.live.server.LiveServer`, and hands :meth:`SimulationFeed.update` to the
engine, which calls it on its own thread after round 0's dispatch and after every round; the
feed swaps in a new frozen :class:`~fedcure_app.live.model.LiveState` (one reference store),
so the HTTP threads read it without any lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedcure_app.config import FedCureConfig
from fedcure_app.live.model import Counts, LiveState, StrategyView
from fedcure_app.trained.names import run_classes


class SimulationFeed:
    """The live state of one simulation (call the feed for the current :class:`LiveState`)."""

    def __init__(self, cfg: FedCureConfig, central_test: bool = False) -> None:
        """``central_test``: the run evaluates on a central test set (``--test-data``)."""
        from fedcure_app.federation import profiles_for

        self.cfg = cfg
        self.devices = [p.name for p in profiles_for(cfg)]
        #: each client's name in id order (the clients folder's entries, set once they are
        #: read; empty for a built-in dataset: the page shows ids)
        self.names: tuple[str, ...] = ()
        self._state = LiveState(
            source="simulation", clock="simulated", mode="simulation", phase="registering",
            global_rounds=cfg.run.global_rounds, clients_registered=0,
            expected_clients=cfg.federation.num_clients, edges_connected=0,
            num_edges=cfg.federation.num_edges, view=StrategyView(tau_e=cfg.method.tau_e),
            # own data: the test split is the union of the clients' held-out parts, unless a
            # central test set was given
            evaluation="federated" if cfg.task is not None and not central_test
            else "central",
            classes=run_classes(cfg))

    def __call__(self) -> LiveState:
        return self._state

    def read_clients(self, cfg: FedCureConfig, names: Sequence[str]) -> None:
        """The clients the run trains, once the clients folder is read: ``cfg`` fitted to the
        entries left after refusals (their device profiles and count) and their ``names``."""
        from fedcure_app.federation import profiles_for

        self.cfg, self.names = cfg, tuple(names)
        self.devices = [p.name for p in profiles_for(cfg)]
        self._state = self._state.with_(expected_clients=cfg.federation.num_clients)

    def update(self, strategy: Any, records: Sequence[Mapping[str, Any]], now_s: float,
               initial_accuracy: float | None = None) -> None:
        """A new state after a transition of ``strategy`` (the engine's thread): its figures,
        the rounds so far and the simulated time ``now_s`` (seconds)."""
        prev = self._state
        view = StrategyView.of(strategy, records, self.cfg.method.tau_e, prev.view,
                               initial_accuracy if initial_accuracy is not None
                               else prev.view.initial_accuracy, devices=self.devices,
                               names=self.names)
        n = self.cfg.federation.num_clients
        self._state = prev.with_(
            phase="training", clients_registered=n, edges_connected=prev.num_edges,
            elapsed_s=float(now_s), view=view, counts=Counts(accepted=len(view.history)))

    def finish(self) -> None:
        """The run is over."""
        self._state = self._state.with_(phase="done")


__all__ = ["SimulationFeed"]
