"""The ClientApp's clients when the run config names them (simulation, ``flwr run``).

In simulation (and under ``flwr run`` without a node data file) the run config names the dataset
and the partition (the same flat keys as :func:`fedcure_app.config.apply_flat`, see
:mod:`fedcure_app.flower.app_config`); :func:`client_state` loads the dataset, the partition,
the device profiles and the model once per run config and keeps them at module level (actors
persist across messages), and :meth:`ClientState.data` slices a client's tensors once. A deployed
node names its own data instead (:func:`fedcure_app.flower.client_app.deployed_state`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context

from fedcure_app.config import FedCureConfig
from fedcure_app.devices import FrequencyActuator, make_actuator
from fedcure_app.flower.app_config import client_fingerprint, client_key, config_from_run_config
from fedcure_app.models import build_model

log = logging.getLogger(__name__)


@dataclass
class ClientState:
    """What one run config's clients share inside a process (an actor or a SuperNode)."""

    cfg: FedCureConfig
    fingerprint: str
    dataset: Any
    client_indices: list[np.ndarray]
    profiles: list[Any]
    model: torch.nn.Module
    tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    actuators: dict[tuple[int, str], FrequencyActuator] = field(default_factory=dict)

    def data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``client``'s (x, y) tensors, sliced once (as the in-process executor does)."""
        if client not in self.tensors:
            idx = torch.from_numpy(np.asarray(self.client_indices[client], dtype=np.int64))
            x = torch.from_numpy(self.dataset.x_train)[idx].contiguous()
            y = torch.from_numpy(self.dataset.y_train)[idx].contiguous()
            self.tensors[client] = (x, y)
        return self.tensors[client]

    def actuator(self, client: int, kind: str) -> FrequencyActuator:
        key = (client, kind)
        if key not in self.actuators:
            if kind == "cgroup":  # clients sharing a process cannot each have a cgroup
                log.warning("cpufreq cgroup needs a deployed client (one process per client); "
                            "emulating the throttle instead")
            self.actuators[key] = make_actuator(
                "emulate" if kind == "cgroup" else kind, self.profiles[client])
        return self.actuators[key]


_lock = threading.Lock()
_configs: dict[tuple, FedCureConfig] = {}
_states: dict[tuple, ClientState] = {}


def config_of(run_config: dict[str, Any]) -> FedCureConfig:
    """The configuration of a Flower run config (parsed once per distinct run config)."""
    key = tuple(sorted(run_config.items()))
    cfg = _configs.get(key)
    if cfg is None:
        cfg = config_from_run_config(run_config)
        _configs[key] = cfg
    return cfg


def client_state(cfg: FedCureConfig) -> ClientState:
    """The cached dataset/partition/devices/model for ``cfg`` (loaded on first use)."""
    key = client_key(cfg)
    with _lock:
        state = _states.get(key)
        if state is None:
            from fedcure_app.data.own_federation import fitted_config, load_federation_data
            from fedcure_app.federation import partition_for, profiles_for

            dataset = load_federation_data(cfg)
            fingerprint = client_fingerprint(cfg)  # as the ServerApp computes it
            cfg = fitted_config(cfg, dataset)  # the clients left when some were refused
            part = partition_for(cfg, dataset)
            state = ClientState(
                cfg=cfg,
                fingerprint=fingerprint,
                dataset=dataset,
                client_indices=[np.asarray(ix) for ix in part.client_indices],
                profiles=profiles_for(cfg),
                model=build_model(dataset.model_spec, dataset.num_classes),
            )
            _states.clear()  # one run at a time per process: drop the previous run's data
            _states[key] = state
            log.info("client data loaded: %s, %d clients", dataset.name, len(part.client_indices))
        return state


def client_id_of(state: ClientState, config: ConfigRecord | None, context: Context) -> int:
    """The client a message is for: its ``client-id``, else the node's ``client-id`` or
    ``partition-id``; checked against the run's number of clients."""
    if config is not None and "client-id" in config:
        client = int(config["client-id"])
    elif "client-id" in context.node_config:
        client = int(context.node_config["client-id"])
    elif "partition-id" in context.node_config:
        client = int(context.node_config["partition-id"])
    else:
        raise ValueError("no client-id in the message and no partition-id in the node config")
    n = state.cfg.federation.num_clients
    if not 0 <= client < n:
        raise ValueError(f"client-id {client} outside 0..{n - 1} (num-clients = {n})")
    return client


def check_fingerprint(state: ClientState, config: ConfigRecord) -> None:
    """The message's ``data-key`` (if any) names the clients this run config describes."""
    want = config.get("data-key")
    if want is not None and str(want) != state.fingerprint:
        raise RuntimeError(
            "this ClientApp's run config describes other clients (dataset, partition, seed, "
            "devices) than the ServerApp's; give both the same run config"
        )


__all__ = ["ClientState", "check_fingerprint", "client_id_of", "client_state", "config_of"]
