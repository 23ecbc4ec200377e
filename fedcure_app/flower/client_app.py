"""Flower ClientApp: local training of one FedCure client, applying its CPU-frequency directive.

Handlers (message contents in :mod:`fedcure_app.flower.edge`):

- ``train``: loads the model sent in ``"arrays"``, trains ``tau-c`` local steps with
  :func:`fedcure_app.training.train_local` (same seed, same data as the in-process executor),
  applies the ``freq-ghz`` directive through a frequency actuator and replies with the model and
  a MetricRecord (``num-examples`` = |D_n|, ``samples``, ``seconds`` (stretched by the actuator),
  ``f-applied-ghz``, ``loss``, ``startup-s``: in the warm trainer the seconds of this message
  spent starting the trainer or loading the node's data and model, 0 once loaded; always 0 in
  a ``flwr-clientapp`` process).
- ``query``: replies with the node's identity (``partition-id``, ``num-partitions`` and/or
  ``client-id`` from its node config), from which the server maps client id → node id.
- ``evaluate``: the sent model on the client's held-out part (a deployed own-data client's
  ``x_test``/``y_test``: federated evaluation), else on its training data as before; the reply's
  MetricRecord has ``num-examples``, ``loss``, ``accuracy`` and the sums of
  :mod:`fedcure_app.flower.eval_metrics` (zero without a held-out part), the same keys from
  every client.

Which data a client holds: the run config names the dataset and the partition (the same flat
keys as :func:`fedcure_app.config.apply_flat`, see :mod:`fedcure_app.flower.app_config`); the
client's id comes from the message's ``client-id`` (in simulation it equals the node's
``partition-id``). A deployed SuperNode (started by ``fedcure-client``) instead names its own
data in its node config: ``data-file`` (a :mod:`fedcure_app.flower.node_data` file with the
samples and the device profile) and ``client-id`` (the cloud's id for it); its ClientApp refuses
messages for any other client id, and logs each applied directive next to the data file.
Dataset, partition, device profiles and per-client tensors are cached at module level, keyed by
the run-config values they depend on, since simulation actors persist across messages.

Frequency control: ``cpufreq`` from the node config, else from the run config (``emulate``
by default): ``emulate`` stretches the measured time to what the directed frequency would take
on the client's simulated device profile, ``sysfs`` writes cpufreq (falling back to emulation
when not allowed), ``cgroup`` (deployed clients) sets the trainer's CPU quota to the profile's
speed at the directed frequency (:mod:`fedcure_app.devices.cgroup`), ``off`` ignores the
directive.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedcure_app.flower.app_config import app_options
from fedcure_app.devices import DEFAULT_CPU_ROOT, FrequencyActuator, make_actuator
from fedcure_app.models import build_model, get_weights, set_weights, weight_shapes
from fedcure_app.flower.eval_metrics import sums_to_metrics
from fedcure_app.flower.packing import is_packed, pack, unpack
from fedcure_app.flower.sim_clients import (
    check_fingerprint,
    client_id_of,
    client_state,
    config_of,
)
from fedcure_app.flower.tools import ray_node_metric
from fedcure_app.runtime.threads import apply_thread_policy
from fedcure_app.runtime.tracing import trace
from fedcure_app.tasks import EvalSums
from fedcure_app.training import evaluate, evaluation_sums, train_local

log = logging.getLogger(__name__)

app = ClientApp()

#: when the message being handled reached a ClientApp (epoch seconds): set by the warm trainer
#: (:mod:`client.trainer`) per message; None in a ``flwr-clientapp`` process, where the
#: process's own start time counts
task_started_at: float | None = None
#: start-up seconds the warm trainer's executor measured inside the message being handled (the
#: trainer started for it); None in a ``flwr-clientapp`` process, which starts for every message
#: (there the start-up is every message's, part of the client's latency, and is not reported)
task_startup_s: float | None = None


def _process_started_at() -> float | None:
    """This process's start (epoch seconds) from /proc, or None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_lock = threading.Lock()


@dataclass
class _DeployedState:
    """A deployed node's own client (``data-file`` in its node config), loaded once."""

    path: str
    client: int
    data: Any  # fedcure_app.flower.node_data.NodeData
    x: torch.Tensor
    y: torch.Tensor
    model: torch.nn.Module
    #: per-batch normalisation of ``x`` (uint8 pixels), None when ``x`` is normalised float32
    norm: Any = None
    actuators: dict[str, FrequencyActuator] = field(default_factory=dict)
    #: the GPU-clock actuator per (kind, root); None where there is none (off, or no devfreq)
    gpu_actuators: dict[str, Any] = field(default_factory=dict)
    #: the held-out part as tensors on the device (:meth:`held_out`), made on first use
    held: tuple[torch.Tensor, torch.Tensor] | None = None

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The held-out part (x_test, y_test) on the client's device, or None (none, or
        empty): what federated evaluation evaluates on."""
        d = self.data
        if d.x_test is None or d.y_test is None or len(d.y_test) == 0:
            return None
        if self.held is None:
            dev = self.x.device
            self.held = (torch.from_numpy(d.x_test).to(dev), torch.from_numpy(d.y_test).to(dev))
        return self.held

    @property
    def device(self) -> str:
        """Where this client trains: ``cpu`` or ``cuda``."""
        return self.x.device.type

    def gpu_actuator(self, kind: str, root: str) -> Any:
        """The :class:`~fedcure_app.devices.devfreq.SysfsDevfreq` for ``--gpufreq kind`` on a
        CUDA client, or None (cpu, off, or no writable devfreq tree: one warning line)."""
        key = f"{kind}:{root}"
        if key not in self.gpu_actuators:
            from fedcure_app.devices.devfreq import make_gpu_actuator

            prof = self.data.profile
            self.gpu_actuators[key] = (make_gpu_actuator(kind, prof.f_min_ghz, prof.f_max_ghz,
                                                         root)
                                       if self.device == "cuda" else None)
        return self.gpu_actuators[key]

    def actuator(self, kind: str, root: str = DEFAULT_CPU_ROOT,
                 node_config: dict[str, Any] | None = None,
                 batch_size: int = 32) -> FrequencyActuator:
        """The actuator for ``kind``; ``root``: the CPU sysfs folder ``sysfs`` writes.

        ``cgroup`` takes from ``node_config`` ``host-samples-per-s`` (this host's samples/s on
        one core; absent or 0: measured once here, training a copy of the model on this
        client's data at ``batch_size``) and ``cgroup-prefix`` (its cgroup is
        ``<prefix>-client<id>-<pid>``, default prefix ``fedcure``)."""
        key = f"{kind}:{root}"
        if key not in self.actuators:
            nc = node_config or {}
            host = float(nc.get("host-samples-per-s", 0.0) or 0.0)
            prefix = str(nc.get("cgroup-prefix", "") or "fedcure")
            self.actuators[key] = make_actuator(
                kind, self.data.profile, root=root, model=self.data.dataset,
                host_sps=host if host > 0 else None,
                calibrate=lambda: self.host_samples_per_s(batch_size),
                cgroup_name=f"{prefix}-client{self.client}-{os.getpid()}")
        return self.actuators[key]

    def host_samples_per_s(self, batch_size: int) -> float:
        """Samples/s this process trains a copy of the model on this client's data (one core)."""
        import copy

        from fedcure_app.devices import calibrate_host

        model = copy.deepcopy(self.model)
        return calibrate_host(
            lambda steps: train_local(model, self.x, self.y, steps=steps, lr=0.01,
                                      batch_size=batch_size, seed=0, norm=self.norm),
            samples_per_step=min(batch_size, len(self.y)))


_deployed: dict[tuple[str, int], _DeployedState] = {}
#: a node data file loaded ahead of the first message (:func:`preload`): path -> (data, x, y,
#: model), taken over by the first :func:`deployed_state` of that path
_preloaded: dict[str, tuple[Any, torch.Tensor, torch.Tensor, torch.nn.Module]] = {}
#: seconds the last :func:`deployed_state` call spent loading (0 when it was loaded already)
_last_load_s = 0.0


def _load_parts(path: str, device: str = "cpu"
                ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.nn.Module]:
    """Node data file ``path``: (data, x, y, model), the tensors and the model on ``device``.
    On the CPU ``x``/``y`` share the file's arrays (no copy); on a GPU ``data`` keeps no copy of
    the images (:func:`_held_once`)."""
    from fedcure_app.flower.node_data import load_node_data
    from fedcure_app.training import resolve_device

    data = load_node_data(path)
    dev = resolve_device(device)
    spec: Any = data.dataset
    if data.task is not None:  # own data: the run's task names the model
        from fedcure_app.data.task import parse_task

        spec = parse_task(data.task, f"{path}: task")
    return _held_once((data, torch.from_numpy(data.x).to(dev), torch.from_numpy(data.y).to(dev),
                       build_model(spec, data.num_classes).to(dev)))


def _held_once(parts: tuple[Any, torch.Tensor, torch.Tensor, torch.nn.Module]
               ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.nn.Module]:
    """``parts`` whose node data no longer holds the images when the tensors are copies of
    them (on a GPU): the images are then held once, on the device."""
    import dataclasses

    data, x = parts[0], parts[1]
    if x.device.type == "cpu" or data.x.shape[0] == 0:
        return parts
    return (dataclasses.replace(data, x=np.empty((0, *data.x.shape[1:]), data.x.dtype)),
            *parts[1:])


def pixel_norm(data: Any) -> Any:
    """The per-batch normalisation of node data ``data`` whose images are uint8 pixels
    (:class:`fedcure_app.training.PixelNorm`, from the file's own constants where it has them),
    or None for a file of normalised float32 images."""
    from fedcure_app.training import PixelNorm

    if data.x.dtype != np.uint8:
        return None
    if data.pixel_norm is None:
        return PixelNorm.for_dataset(data.dataset)
    return PixelNorm(*(np.asarray(v, dtype=np.float32) for v in data.pixel_norm))


def _on(parts: tuple[Any, torch.Tensor, torch.Tensor, torch.nn.Module], device: str
        ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.nn.Module]:
    """Preloaded ``parts`` moved to ``device`` where they are elsewhere."""
    from fedcure_app.training import resolve_device

    dev = resolve_device(device)
    data, x, y, model = parts
    if x.device.type == dev.type:
        return parts
    return _held_once((data, x.to(dev), y.to(dev), model.to(dev)))


def preload(path: str, warm_steps: int = 2, batch_size: int = 32,
            device: str | None = None) -> float:
    """Load node data file ``path`` and its model before any message arrives, and run
    ``warm_steps`` throw-away SGD steps (torch's first backward pass, the optimiser and the
    packing code pay their one-off costs here, not in the first task). Returns the seconds it
    took. The model's weights are overwritten by every train message, so the warm-up changes
    no result. ``device``: cpu or cuda (default ``$FEDCURE_DEVICE``, else cpu)."""
    t0 = time.perf_counter()
    apply_thread_policy(where="ClientApp")
    data, x, y, model = _load_parts(str(path), device or os.environ.get("FEDCURE_DEVICE", "cpu"))
    if warm_steps > 0 and len(y):
        weights = get_weights(model)
        shapes = weight_shapes(model)
        set_weights(model, unpack(pack(weights), shapes))
        train_local(model, x, y, steps=warm_steps, lr=0.01, batch_size=batch_size, seed=0,
                    norm=pixel_norm(data))
        ArrayRecord(pack(get_weights(model)))
        set_weights(model, weights)
    with _lock:
        _preloaded.clear()
        _preloaded[str(path)] = (data, x, y, model)
    return time.perf_counter() - t0


def deployed_state(context: Context) -> _DeployedState | None:
    """The node's own client when its node config names a ``data-file``, or a ``data-path``
    (Flower's convention: the node's own data, read under the run config's task into a node
    data file once, :func:`fedcure_app.flower.own_node.node_file_for_path`), else None."""
    global _last_load_s
    conf = context.node_config
    path = conf.get("data-file")
    if not path and conf.get("data-path"):
        from fedcure_app.flower.app_config import config_from_run_config
        from fedcure_app.data.errors import DatasetError
        from fedcure_app.flower.own_node import node_file_for_path

        ident = conf.get("client-id", conf.get("partition-id"))
        if ident is None:
            raise ValueError("node config has data-path but no client-id or partition-id")
        cfg = config_from_run_config(context.run_config)
        if cfg.task is not None:  # the ServerApp's task: its model needs this node's consent
            from fedcure_app.data.model_consent import check_consent, parse_allowed

            check_consent(cfg.task.model, parse_allowed(str(conf.get("allow-model", ""))),
                          "the run config's task")
        try:
            path = str(node_file_for_path(cfg, str(conf["data-path"]), int(ident)))
        except DatasetError as err:  # its line names files: it stays in this node's log
            from fedcure_app.flower.own_node import DataRefused
            from fedcure_app.protocol.withdraw import withdraw_reason

            log.error("data-path refused: %s", " ".join(str(err).split()))
            raise DataRefused(f"data-path refused: {withdraw_reason(err)}") from None
        conf = {**conf, "client-id": int(ident)}
    if not path:
        return None
    if "client-id" not in conf:
        raise ValueError("node config has data-file but no client-id")
    client = int(conf["client-id"])
    key = (str(path), client)
    with _lock:
        state = _deployed.get(key)
        _last_load_s = 0.0
        if state is None:
            parts = _preloaded.pop(str(path), None)
            device = str(conf.get("device", "cpu"))
            t0 = time.perf_counter()
            if parts is None or parts[1].device.type != device:  # this message pays the load
                parts = _load_parts(str(path), device) if parts is None else _on(parts, device)
                _last_load_s = time.perf_counter() - t0
            data, x, y, model = parts
            state = _DeployedState(path=str(path), client=client, data=data, x=x, y=y,
                                   model=model, norm=pixel_norm(data))
            _deployed.clear()
            _deployed[key] = state
        return state


def _check_deployed_id(state: _DeployedState, config: ConfigRecord | None) -> None:
    if config is not None and "client-id" in config and int(config["client-id"]) != state.client:
        raise ValueError(
            f"this SuperNode holds client {state.client}, but the message is for client "
            f"{int(config['client-id'])}"
        )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train ``tau-c`` local steps on this client's data at the directed CPU frequency."""
    trace("app.start", msg.metadata.message_id)
    apply_thread_policy(where="ClientApp")
    conf = msg.content["config"]
    kind = str(context.node_config.get("cpufreq", app_options(context.run_config).cpufreq))
    deployed = deployed_state(context)
    load_s = _last_load_s if deployed is not None else 0.0
    if deployed is not None:
        _check_deployed_id(deployed, conf)
        client = deployed.client
        made, t_act = len(deployed.actuators), time.perf_counter()
        actuator = deployed.actuator(
            kind, str(context.node_config.get("cpufreq-root", DEFAULT_CPU_ROOT)),
            dict(context.node_config), int(conf["batch-size"]))
        if len(deployed.actuators) > made:  # made here (a cgroup one measures the host): start-up
            load_s += time.perf_counter() - t_act
        f_max = deployed.data.profile.f_max_ghz
        x, y, model, norm = deployed.x, deployed.y, deployed.model, deployed.norm
    else:
        cfg = config_of(context.run_config)
        state = client_state(cfg)
        check_fingerprint(state, conf)
        client = client_id_of(state, conf, context)
        pid = context.node_config.get("partition-id")
        if pid is not None and int(pid) != client and not conf.get("node-shared", False):
            log.warning("node with partition-id %s asked to train client %d", pid, client)
        actuator = state.actuator(client, kind)
        f_max = state.profiles[client].f_max_ghz
        x, y = state.data(client)
        model, norm = state.model, None
    f_req = float(conf.get("freq-ghz", 0.0))
    # no directive (0): run flat out
    f_applied = float(actuator.apply(f_req if f_req > 0 else f_max))
    gpu_hz = 0
    if deployed is not None and deployed.device == "cuda":
        from fedcure_app.devices.devfreq import DEFAULT_DEVFREQ_ROOT

        gpu = deployed.gpu_actuator(str(context.node_config.get("gpufreq", "off")),
                                    str(context.node_config.get("gpufreq-root",
                                                                DEFAULT_DEVFREQ_ROOT)))
        if gpu is not None:
            gpu_hz = int(gpu.apply(f_req if f_req > 0 else f_max))
    sent = msg.content["arrays"].to_numpy_ndarrays()
    shapes = weight_shapes(model)
    set_weights(model, unpack(sent, shapes))
    trace("app.train_start", msg.metadata.message_id)
    res = train_local(
        model, x, y,
        steps=int(conf["tau-c"]), lr=float(conf["lr"]), batch_size=int(conf["batch-size"]),
        seed=int(conf["seed"]), norm=norm,
    )
    trace("app.train_end", msg.metadata.message_id)
    seconds = float(actuator.stretch(res.seconds, f_applied))
    metrics = MetricRecord({
        "num-examples": int(len(y)),
        "samples": int(res.samples),
        "seconds": seconds,
        "f-applied-ghz": f_applied,
        "loss": float(res.loss),
        # start-up inside this message: the warm trainer's (its start, if the executor had to
        # start it for this message, and a data load); a flwr-clientapp process starts for every
        # message, so its start-up is part of every latency and is reported as 0
        "startup-s": float(task_startup_s + load_s) if task_startup_s is not None else 0.0,
        **ray_node_metric(),
    })
    if deployed is not None:
        from fedcure_app.flower.node_data import append_applied

        append_applied(deployed.path, {
            "client": client, "task": str(conf.get("task-id", "")),
            "edge_round": int(conf.get("edge-round", 0)), "directive_ghz": f_req,
            "applied_ghz": f_applied, "cpufreq": kind, "measured_s": float(res.seconds),
            "device": deployed.device, "gpu_applied_hz": gpu_hz,
            "seconds": seconds,
            # ClientApp start to reply: process start (flwr-clientapp) or task pick-up (warm)
            "app_started_at": task_started_at if task_started_at is not None
            else _process_started_at(),
            "finished_at": time.time(),
        })
    weights = get_weights(model)  # answered in the form it was sent (fedcure_app.flower.packing)
    content = RecordDict({"arrays": ArrayRecord(pack(weights) if is_packed(sent, shapes)
                                                else weights), "metrics": metrics})
    reply = Message(content, reply_to=msg)
    trace("app.end", msg.metadata.message_id)
    return reply


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The node's identity: ``partition-id``/``num-partitions``/``client-id`` where known."""
    ident: dict[str, Any] = {}
    for key in ("partition-id", "num-partitions", "client-id"):
        if key in context.node_config:
            ident[key] = int(context.node_config[key])
    ident["cpufreq"] = str(
        context.node_config.get("cpufreq", app_options(context.run_config).cpufreq)
    )
    return Message(RecordDict({"identity": ConfigRecord(ident)}), reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """The sent model on this client's held-out part (federated evaluation: loss, accuracy and
    the sums of :mod:`fedcure_app.flower.eval_metrics`); a client without one evaluates on its
    training data and reports zero sums."""
    apply_thread_policy(where="ClientApp")
    conf = msg.content.config_records.get("config")
    deployed = deployed_state(context)
    held = None
    if deployed is not None:
        _check_deployed_id(deployed, conf)
        x, y, model, norm = deployed.x, deployed.y, deployed.model, deployed.norm
        held = deployed.held_out()
        num_classes = int(deployed.data.num_classes)
    else:
        cfg = config_of(context.run_config)
        state = client_state(cfg)
        client = client_id_of(state, conf, context)
        x, y = state.data(client)
        model, norm = state.model, None
        num_classes = int(state.dataset.num_classes)
    shapes = weight_shapes(model)
    set_weights(model, unpack(msg.content["arrays"].to_numpy_ndarrays(), shapes))
    if held is not None:
        sums = evaluation_sums(model, held[0], held[1], num_classes, norm=norm)
        n, loss, acc = sums.samples, sums.loss_sum / sums.samples, sums.correct / sums.samples
    else:
        res = evaluate(model, x, y, norm=norm)
        sums = EvalSums.empty(num_classes)
        n, loss, acc = res.samples, res.loss, res.accuracy
    metrics = MetricRecord({"num-examples": int(n), "loss": float(loss),
                            "accuracy": float(acc), **sums_to_metrics(sums)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


__all__ = ["app", "client_state", "deployed_state", "preload"]
