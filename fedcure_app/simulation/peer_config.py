"""The ``[peers]`` section of the configuration schema (``fedcure_app.config``): which peer
``fedcure simulate --method`` runs instead of FedCure's hierarchy, and its papers' knobs, each
with a default, a type and a range check. Imports nothing of the project (the schema imports
it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PeerName = Literal["none", "fedavg", "hierfavg", "fedbuff", "fedat"]
#: The peers a user would run instead (docs/DESIGN.md, "The peers"): ``--method NAME`` runs one
#: on the same simulated clock, devices and data (``fedcure_app.simulation.peer_engine``).
PEER_METHODS: tuple[str, ...] = ("fedavg", "hierfavg", "fedbuff", "fedat")


class PeersConfig(BaseModel):
    """Which peer runs instead of FedCure's hierarchy, with its paper's knobs (sources:
    docs/benchmarks.md, "Against the peers")."""

    model_config = ConfigDict(alias_generator=lambda n: n.replace("_", "-"),
                              populate_by_name=True, extra="forbid", validate_assignment=True)

    peer: PeerName = Field("none", description="none (FedCure's hierarchy), or the peer to run: "
                           "fedavg, hierfavg, fedbuff, fedat")
    fraction: float = Field(0.1, gt=0.0, le=1.0, description="fedavg: C, the fraction of the "
                            "clients sampled each round (McMahan et al. 2017: 0.1)")
    buffer_k: int | None = Field(None, ge=1, le=1_000_000, description="fedbuff: K, client "
                                 "updates per server step; None: 10 (Nguyen et al. 2022), at "
                                 "most the concurrency")
    concurrency: int | None = Field(None, ge=1, le=1_000_000, description="fedbuff: clients "
                                    "training at once; None: all clients (the paper's 1000, "
                                    "capped by the fleet)")
    server_lr: float = Field(1.0, gt=0.0, le=100.0, description="fedbuff: η_g, the server "
                             "learning rate of w ← w + η_g·mean(s(τ)·Δ)")
    tiers: int | None = Field(None, ge=1, le=1_000_000, description="fedat: tiers the clients "
                              "are cut into by latency; None: 5 (Chai et al. 2021), at most "
                              "the clients")
    frequency: Literal["top", "fedcure"] = Field(
        "top", description="a peer's client CPU frequency: top (f_max, the peers have no "
        "frequency rule) or fedcure (Theorem 2 with T̂ the round's predicted latency)")

    def check_fits(self, num_clients: int) -> None:
        """ValueError when a knob asks for more clients than the federation has."""
        n = num_clients
        for name, value in (("concurrency", self.concurrency), ("tiers", self.tiers)):
            if value is not None and value > n:
                raise ValueError(f"peers.{name} ({value}) exceeds num_clients ({n})")
        if self.buffer_k is not None and self.buffer_k > (self.concurrency or n):
            raise ValueError(f"peers.buffer_k ({self.buffer_k}) exceeds the clients training "
                             f"at once ({self.concurrency or n}): the buffer would never fill")


__all__ = ["PEER_METHODS", "PeerName", "PeersConfig"]
