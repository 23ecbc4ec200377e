"""What readers see of the run without the controller's lock: :class:`RunViews`.

After every transition the controller, holding its lock, publishes a new immutable
:class:`~cloud_server.state.RoundView` and :class:`~fedcure_app.live.model.StrategyView`
(:meth:`RunViews.publish`); :meth:`RunViews.status` builds a frozen
:class:`~cloud_server.state.StatusSnapshot` from the round view, the roster's counts and the
progress board without taking any lock (``Monitor.Status``, the live view, ``/metrics``).
"""

from __future__ import annotations

from collections.abc import Callable

from fedcure_app.config import FedCureConfig
from fedcure_app.live.model import StrategyView
from cloud_server.progress import ProgressBoard
from cloud_server.state import Federation, Phase, Roster, RoundView, RunLog, StatusSnapshot


class RunViews:
    """The latest published views of the run (see the module docstring).

    Parameters
    ----------
    cfg:
        The configuration (τ_e, the number of global rounds).
    roster:
        The registered clients and connected edges (counted in :meth:`status`).
    log:
        The run's records (the strategy view's rounds).
    progress:
        The edges' reports inside a task (shown in :meth:`status`).
    """

    def __init__(self, cfg: FedCureConfig, roster: Roster, log: RunLog,
                 progress: ProgressBoard) -> None:
        self.cfg = cfg
        self.roster = roster
        self.log = log
        self.progress = progress
        self.round = RoundView()
        #: the strategy's figures and the rounds as of its last transition
        self.strategy = StrategyView(tau_e=cfg.method.tau_e)

    def publish(self, federation: Federation | None, *, rebuild: bool = False) -> None:
        """A new :class:`RoundView` and :class:`StrategyView` of ``federation``'s strategy
        (call holding the controller's lock). ``rebuild``: the rounds' history is built anew
        rather than extended (a federated evaluation filled an earlier round's accuracy)."""
        tau_e = self.cfg.method.tau_e
        if federation is None:
            self.round, self.strategy = RoundView(), StrategyView(tau_e=tau_e)
            return
        s = federation.strategy
        self.round = RoundView.of(s)
        self.strategy = StrategyView.of(s, self.log.records, tau_e,
                                        None if rebuild else self.strategy,
                                        self.log.initial_accuracy,
                                        devices=[c.profile.name for c in federation.clients],
                                        names=[c.name for c in federation.clients])

    def status(self, phase: Phase, is_live: Callable[[str], bool]) -> StatusSnapshot:
        """Where the run stands, without taking the lock: the strategy's figures as of its last
        transition, the roster's counts and the progress of the tasks still expected
        (``is_live(task_id)``), their ETAs counted from each coalition's T̂ as of that
        transition."""
        view, reg = self.round, self.roster
        return StatusSnapshot(
            phase=phase, version=view.version, round=view.round,
            global_rounds=self.cfg.run.global_rounds, clients_registered=len(reg.clients),
            expected_clients=reg.expected_clients, edges_connected=len(reg.connected),
            num_edges=reg.num_edges, in_flight=view.in_flight,
            progress=self.progress.snapshot(is_live, self.strategy.t_hat_s))


__all__ = ["RunViews"]
