"""The one configuration schema shared by every role (simulation, cloud, edge, client).

Every knob has a default (the paper's where it gives one), a type and a range check. Field names
are snake_case in Python; TOML/JSON files and Flower's run-config may use the hyphenated spelling
(``num-clients``) as well, both are accepted.

Symbols follow the paper and ``DESIGN.md``:

- ℓ (``ell``) and k (``k``): cloud staleness weight ξ = ℓ·k^φ.
- β (``beta``): latency term weight in the scheduling rule.
- κ (``kappa``): virtual-queue scale, δ_m = κ·|D_m|/|D|.
- α (``alpha``), γ (``gamma``), ς (``varsigma``): utility α(1 − c_n/(f·T̂)) − γ f^ς of the
  CPU-frequency rule (Theorem 2).
- τ_c (``tau_c``) local steps per edge round (local epochs with ``tau_c_unit = "epochs"``),
  τ_e (``tau_e``) edge rounds per global round.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from fedcure_app.data.task import TaskConfig
from fedcure_app.simulation.peer_config import PEER_METHODS, PeersConfig

#: The smallest histogram ε but 0 (exact counts): Laplace noise of scale 1/ε = 1000 samples per
#: class. Below it the noise swamps any real count, and noisy counts beyond the cloud's 10⁹
#: per class bound (cloud_server.validation) grow likely as ε → 0.
MIN_HISTOGRAM_EPSILON = 1e-3

FormationRule = Literal["fedcure", "none", "kmeans", "meanshift", "selfish", "pareto"]
SchedulerName = Literal["fedcure", "greedy", "fair", "random"]
PartitionName = Literal["edge-noniid", "dirichlet", "iid", "shards"]
DatasetName = Literal["digits", "mnist", "cifar10", "svhn", "cinic10"]
ExecutorName = Literal["inprocess", "batched", "flower"]
MethodName = Literal["fedcure", "fedfair", "fedgreedy", "fair", "greedy"]
TauCUnit = Literal["steps", "epochs"]

#: The paper's five methods as (formation rule, scheduler) presets.
METHOD_PRESETS: dict[str, tuple[str, str]] = {
    "greedy": ("none", "greedy"),
    "fair": ("none", "fair"),
    "fedgreedy": ("fedcure", "greedy"),
    "fedfair": ("fedcure", "fair"),
    "fedcure": ("fedcure", "fedcure"),
}

def _alias(name: str) -> str:
    return name.replace("_", "-")


class _Section(BaseModel):
    """Base for every section: hyphenated aliases, unknown keys rejected, assignment checked."""

    model_config = ConfigDict(
        alias_generator=_alias,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        frozen=False,
    )


class MethodConfig(_Section):
    """The FedCure method's knobs (paper defaults)."""

    ell: float = Field(0.2, gt=0.0, le=1.0, description="ℓ, base cloud mixing weight")
    k: float = Field(0.95, gt=0.0, le=1.0, description="k, staleness decay (paper: 0.9–0.99)")
    beta: float = Field(0.5, ge=0.0, description="β, latency weight of the scheduling rule")
    kappa: float = Field(1.0, gt=0.0, description="κ, virtual-queue scale: δ_m = κ·|D_m|/|D|")
    alpha: float = Field(1.0, gt=0.0, description="α, utility weight of finishing fast")
    gamma: float = Field(0.05, gt=0.0, description="γ, energy price per GHz^ς")
    varsigma: float = Field(2.0, gt=0.0, description="ς, exponent of the energy term")
    tau_c: int = Field(5, ge=1, le=100_000, description="τ_c, local steps per edge round "
                       "(local epochs with tau-c-unit = epochs)")
    tau_c_unit: TauCUnit = Field(
        "steps", description="what τ_c counts: steps (mini-batches of batch-size samples) or "
        "epochs (⌈|D_n|/batch-size⌉ mini-batches each, so a client's work grows with its data; "
        "docs/DESIGN.md, 'τ_c counts mini-batch steps')")
    tau_e: int = Field(12, ge=1, le=100_000, description="τ_e, edge rounds per global round")
    lr: float = Field(0.01, gt=0.0, le=10.0, description="client learning rate")
    batch_size: int = Field(32, ge=1, le=65_536, description="client mini-batch size")
    momentum: float = Field(
        0.0, ge=0.0, lt=1.0, description="SGD momentum of local training; the optimiser (and "
        "its momentum buffer) starts fresh in every edge round")
    max_concurrent: int | None = Field(
        None, ge=1, description="K, coalitions training at once; None means ⌈M/2⌉"
    )
    formation: FormationRule = Field("fedcure", description="coalition formation rule")
    scheduler: SchedulerName = Field("fedcure", description="coalition scheduler")


class FederationConfig(_Section):
    """Who takes part: clients, edge servers, classes."""

    num_clients: int = Field(50, ge=1, le=1_000_000)
    num_edges: int = Field(5, ge=1, le=100_000)
    num_classes: int = Field(10, ge=2, le=100_000)

    @model_validator(mode="after")
    def _edges_not_more_than_clients(self) -> "FederationConfig":
        if self.num_edges > self.num_clients:
            raise ValueError(
                f"num_edges ({self.num_edges}) > num_clients ({self.num_clients}): "
                "every edge server needs at least one client"
            )
        return self


class DataConfig(_Section):
    """Which data and how it is split among clients."""

    dataset: DatasetName = "digits"
    data_dir: str | None = Field(None, description="root holding the dataset files")
    partition: PartitionName = "edge-noniid"
    dirichlet_alpha: float = Field(0.5, gt=0.0, description="concentration for 'dirichlet'")
    shards_per_client: int = Field(2, ge=1, description="shards per client for 'shards'")
    classes_per_edge: int = Field(2, ge=1, description="classes per ES for 'edge-noniid'")
    clients_data: str | None = Field(
        None, description="with a task: a folder holding one entry per client (a folder of "
        "class folders, an .npz, a .csv or a datasets.save_to_disk folder), sorted by name; "
        "client i trains on entry i only (no partition is cut)")
    holdout: float = Field(
        0.1, ge=0.0, lt=1.0, description="with a task: the seeded, stratified fraction of a "
        "client's data held out for federated evaluation when it has no test part")
    label_column: str = Field("label", min_length=1, max_length=256,
                              description="with a task: the label column of a client's CSV")
    histogram_epsilon: float = Field(
        0.0, ge=0.0, le=1e6, allow_inf_nan=False, description="ε of the Laplace noise on "
        "each client's label histogram, the only thing formation learns of its data "
        "(ε-differential privacy per release; 0: exact counts, else at least 0.001); a "
        "deployed client's --histogram-epsilon overrides it")
    histogram_min_count: int = Field(
        0, ge=0, le=1_000_000, description="classes a client holds fewer samples of are "
        "reported as 0 (after the noise)")

    @field_validator("histogram_epsilon")
    @classmethod
    def _epsilon_bound(cls, v: float) -> float:
        if 0 < v < MIN_HISTOGRAM_EPSILON:
            raise ValueError(f"must be 0 (exact counts) or >= {MIN_HISTOGRAM_EPSILON:g}")
        return v


class RunConfig(_Section):
    """How long and how reproducibly to run."""

    global_rounds: int = Field(100, ge=1, le=10_000_000)
    eval_every: int = Field(5, ge=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    executor: ExecutorName = "inprocess"
    eval_every_s: float | None = Field(None, gt=0.0, le=1e9, description="evaluate at the "
                                       "first round past every this many simulated seconds")
    time_budget_s: float | None = Field(None, gt=0.0, le=1e9, description="stop at the first "
                                        "round at or past this simulated time")
    cuda_graphs: bool = Field(
        True, description="batched executor on a GPU: record each edge round as a CUDA graph "
        "and replay it (same results to float tolerance; off: the same ops launched one by one)")


#: Default access-network caps of the ESs (Mbit/s), from a Wi-Fi 6 / 5G cell down to a
#: congested LTE cell; why the default population needs them: docs/DESIGN.md, "Simulated
#: devices and networks".
DEFAULT_EDGE_ACCESS_MBPS: tuple[float, ...] = (100.0, 50.0, 20.0, 10.0, 5.0)


class DevicesConfig(_Section):
    """The simulated device population and links (deployment measures instead)."""

    mix: list[str] | None = Field(
        None, description="device presets to draw clients from (default: all presets)"
    )
    profiles_file: str | None = Field(None, description="JSON/TOML file of device profiles")
    edge_link_mbps: float = Field(100.0, gt=0.0, description="edge↔cloud link, Mbit/s")
    edge_round_overhead_s: float = Field(
        0.0, ge=0.0, le=3600.0, allow_inf_nan=False,
        description="seconds a deployment's messaging adds to every edge round beyond compute "
        "and transfers; the simulator and the latency prior add τ_e times it to a task "
        "(0: the paper's model; bench/testbed.py measures it)")
    edge_round_client_samples: int = Field(
        0, ge=0, le=100_000_000,
        description="work a deployed client does every edge round beyond its training steps "
        "(receiving, loading and saving the model), in training samples of its device; the "
        "simulator and the latency prior add it to each client's samples of an edge round "
        "(0: the paper's model; bench/testbed.py measures it)")
    edge_access_mbps: list[Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]] = Field(
        default_factory=lambda: list(DEFAULT_EDGE_ACCESS_MBPS),
        description="cap (Mbit/s) on the client↔ES link rates of each ES's access network: ES m "
        "gets entry m mod the list's length, a client's rate is min(its radio, that cap); "
        "empty: no caps (docs/DESIGN.md, 'Simulated devices and networks')", max_length=10_000)
    calibrate_prior: bool | None = Field(
        None, description="rescale the latency priors by observed/predicted latency (empirical "
        "Bayes); default: on in deployment (measured latencies), off in simulation")

    warmup_tasks: int | None = Field(
        None, ge=0, le=1000, description="each coalition's first tasks that T̂ does not learn "
        "from (recorded, aggregated, but a warm-up: processes, caches and the host settling); "
        "default: 1 in deployment, 0 in simulation (a simulated task has no warm-up)")

    def calibrates(self, deployed: bool) -> bool:
        """Whether the latency estimator calibrates its prior in this role."""
        return deployed if self.calibrate_prior is None else self.calibrate_prior

    def warmups(self, deployed: bool) -> int:
        """How many of each coalition's first tasks the latency estimator leaves out."""
        if self.warmup_tasks is not None:
            return self.warmup_tasks
        return 1 if deployed else 0


class ReliabilityConfig(_Section):
    """How the cloud screens edge models and notices a lost edge server (deployment)."""

    norm_factor: float = Field(
        10.0, gt=1.0, description="refuse an edge model farther from the global model than "
        "norm-factor × the median distance of recently accepted ones")
    norm_window: int = Field(20, ge=1, le=100_000, description="accepted distances remembered")
    norm_min_history: int = Field(
        3, ge=1, le=100_000, description="accepted models needed before the median part of "
        "the norm screen acts (the step bound acts from the first)")
    norm_grad_bound: float = Field(
        100.0, gt=0.0, le=1e12, allow_inf_nan=False, description="G, a conservative bound on a "
        "mini-batch gradient's L2 norm: from the first update on, an edge model farther from "
        "the global model than lr·τ_c·τ_e·G (the farthest a task's SGD steps move it) is "
        "refused; raise it for a model whose gradients are longer")
    norm_growth: float = Field(
        2.0, ge=1.0, le=100.0, allow_inf_nan=False, description="an accepted distance enters "
        "the norm screen's history clipped to norm-growth × the history's median, so one "
        "accepted update raises the screen's limit at most this factor")
    deadline_quantile: float = Field(
        0.99, gt=0.0, lt=1.0, description="latency quantile (estimator) a task's deadline uses")
    deadline_slack: float = Field(2.0, ge=1.0, description="deadline = slack × that quantile")
    deadline_min_s: float = Field(30.0, gt=0.0, description="shortest task deadline, seconds")
    first_deadline_s: float = Field(
        600.0, gt=0.0, description="shortest task deadline while no task has been answered yet "
        "(the latency prior is only the device profiles' guess), seconds")
    max_client_weight: float = Field(
        0.5, gt=0.0, le=1.0, allow_inf_nan=False, description="the largest share of its "
        "coalition's FedAvg weight one client may take, whatever sample count it registered "
        "(the others share the rest in proportion to their counts; a coalition of fewer than "
        "1/max-client-weight clients weights them equally); 1: plain FedAvg")
    late_staleness_bound: int = Field(
        16, ge=0, le=1_000_000, description="an answer arriving after its task's deadline is "
        "still aggregated as a stale update (weight ξ = ℓ·k^φ) while its staleness φ, the "
        "versions since its base, is at most this; later ones are refused (0: refuse every "
        "late answer unless no version passed)")


class _EnvSection(_Section):
    """A section a role reads from ``FEDCURE_*`` environment variables (:attr:`ENV`: variable ->
    field), because the process that needs it is started by another (Flower's or ours)."""

    ENV: ClassVar[dict[str, str]] = {}

    def to_env(self) -> dict[str, str]:
        """The values as ``FEDCURE_*`` environment variables."""
        return {var: str(getattr(self, name)) for var, name in self.ENV.items()}

    @classmethod
    def from_env(cls, env: dict[str, str], **overrides: Any) -> Any:
        """Read the ``FEDCURE_*`` variables (unset: default), then ``overrides``;
        :class:`ConfigError` when a value is bad."""
        data = {name: env[var] for var, name in cls.ENV.items() if env.get(var, "") != ""}
        data.update(overrides)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(_one_line(err)) from None


class WarmClientConfig(_EnvSection):
    """How a deployed client (``fedcure-client``) runs its ClientApp; local to each client, so
    not part of :class:`FedCureConfig` (which the cloud hands every role). Times in seconds."""

    runtime: Literal["warm", "flower"] = Field(
        "warm", description="warm: one long-lived executor + trainer (torch, model and data "
        "stay loaded); flower: Flower's SuperExec starting a flwr-clientapp per message")
    supernode_idle_min_s: float = Field(
        0.01, gt=0.0, le=3.0, description="first SuperNode wait after a pull found nothing")
    supernode_idle_max_s: float = Field(
        0.2, gt=0.0, le=3.0, description="longest SuperNode wait between empty pulls "
        "(Flower's own: 3)")
    supernode_reply_poll_s: float = Field(
        0.01, gt=0.0, le=0.5, description="SuperNode's poll for the ClientApp's reply where "
        "its Runtime API cannot wake it on the push (Flower's own: 0.5)")
    supernode_hot_s: float = Field(
        2.0, ge=0.0, le=600.0, description="for this long after a message the SuperNode's "
        "waits between empty pulls stay at most supernode-hot-max-s (the next edge round's "
        "message comes soon); 0: off")
    supernode_hot_max_s: float = Field(
        0.04, gt=0.0, le=3.0, description="longest SuperNode wait between empty pulls within "
        "supernode-hot-s of a message")
    executor_poll_min_s: float = Field(
        0.005, gt=0.0, le=5.0, description="first executor wait after a task, before asking "
        "the SuperNode for the next")
    executor_poll_max_s: float = Field(
        0.1, gt=0.0, le=5.0, description="longest executor wait between task requests")
    trainer_restarts: int = Field(
        20, ge=0, le=10_000, description="trainer (and executor) restarts before the client "
        "gives up")
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu", description="where the trainer trains and evaluates: cpu, cuda, or auto (CUDA "
        "when torch sees a GPU, else the CPU)")
    gpufreq: Literal["devfreq", "off", "preset"] = Field(
        "preset", description="how a CUDA client applies the frequency directive to its GPU "
        "clock: devfreq (min_freq/max_freq of the GPU's devfreq device), off, or preset "
        "(devfreq when the client's device profile is a Jetson, else off)")

    @model_validator(mode="after")
    def _ordered(self) -> "WarmClientConfig":
        if self.supernode_idle_min_s > self.supernode_idle_max_s:
            raise ValueError("supernode-idle-min-s must not exceed supernode-idle-max-s")
        if self.executor_poll_min_s > self.executor_poll_max_s:
            raise ValueError("executor-poll-min-s must not exceed executor-poll-max-s")
        return self

    #: environment variable -> field (how fedcure-client hands the values to its children)
    ENV: ClassVar[dict[str, str]] = {
        "FEDCURE_SUPERNODE_IDLE_MIN_S": "supernode_idle_min_s",
        "FEDCURE_SUPERNODE_IDLE_MAX_S": "supernode_idle_max_s",
        "FEDCURE_SUPERNODE_REPLY_POLL_S": "supernode_reply_poll_s",
        "FEDCURE_SUPERNODE_HOT_S": "supernode_hot_s",
        "FEDCURE_SUPERNODE_HOT_MAX_S": "supernode_hot_max_s",
        "FEDCURE_EXECUTOR_POLL_MIN_S": "executor_poll_min_s",
        "FEDCURE_EXECUTOR_POLL_MAX_S": "executor_poll_max_s",
        "FEDCURE_TRAINER_RESTARTS": "trainer_restarts",
        "FEDCURE_DEVICE": "device",
        "FEDCURE_GPUFREQ": "gpufreq",
    }



class EdgeLinkConfig(_EnvSection):
    """How an edge's SuperLink answers pulls (:mod:`fedcure_app.flower.fastpath.held_pulls`); local
    to each edge. Times in seconds."""

    superlink_hold_s: float = Field(
        20.0, ge=0.0, le=25.0, description="how long a SuperNode's pull that finds no message "
        "waits for one at the SuperLink (0: answer at once, as Flower does; below the "
        "SuperNode's 30 s request timeout)")
    superlink_reply_hold_s: float = Field(
        2.0, ge=0.0, le=25.0, description="how long the edge ServerApp's pull of its clients' "
        "replies waits for one when none is in (0: answer at once)")
    superlink_threads: int = Field(
        512, ge=40, le=10_000, description="worker threads of the SuperLink's web server (a "
        "held pull takes one while it waits: more than the edge's clients)")

    ENV: ClassVar[dict[str, str]] = {
        "FEDCURE_SUPERLINK_HOLD_S": "superlink_hold_s",
        "FEDCURE_SUPERLINK_REPLY_HOLD_S": "superlink_reply_hold_s",
        "FEDCURE_SUPERLINK_THREADS": "superlink_threads",
    }


class FedCureConfig(_Section):
    """The whole configuration: one object for every role."""

    method: MethodConfig = Field(default_factory=MethodConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    reliability: ReliabilityConfig = Field(default_factory=ReliabilityConfig)
    peers: PeersConfig = Field(default_factory=PeersConfig)
    task: TaskConfig | None = Field(
        None, description="the user's own task (a task file's [task]); None: the built-in "
        "dataset of [data]")

    @model_validator(mode="after")
    def _task_classes(self) -> "FedCureConfig":
        if self.task is not None and self.federation.num_classes != self.task.num_classes:
            raise ValueError(f"federation.num_classes ({self.federation.num_classes}) differs "
                             f"from the task's {self.task.num_classes} classes")
        return self

    @model_validator(mode="after")
    def _concurrency_fits(self) -> "FedCureConfig":
        k = self.method.max_concurrent
        m = self.federation.num_edges
        if k is not None and k > m:
            raise ValueError(
                f"max_concurrent K={k} exceeds num_edges M={m} (the number of coalitions); "
                f"use K <= {m}"
            )
        return self

    @model_validator(mode="after")
    def _peer_knobs_fit(self) -> "FedCureConfig":
        return self.peers.check_fits(self.federation.num_clients) or self

    @property
    def concurrency(self) -> int:
        """K, the number of coalitions allowed to train at once (default ⌈M/2⌉)."""
        if self.method.max_concurrent is not None:
            return self.method.max_concurrent
        return max(1, math.ceil(self.federation.num_edges / 2))

    def with_method_preset(self, name: str) -> "FedCureConfig":
        """A copy with formation and scheduler of one of the paper's methods, or running one
        of the :data:`PEER_METHODS` (no formation: a peer keeps the initial partition)."""
        key, new = name.lower(), self.model_copy(deep=True)
        if key not in METHOD_PRESETS and key not in PEER_METHODS:
            raise ConfigError(f"unknown method {name!r}; choose one of "
                              f"{', '.join([*METHOD_PRESETS, *PEER_METHODS])}")
        new.peers.peer = key if key in PEER_METHODS else "none"  # type: ignore[assignment]
        new.method.formation, new.method.scheduler = METHOD_PRESETS.get(  # type: ignore
            key, ("none", new.method.scheduler))
        return new


class ConfigError(ValueError):
    """A configuration problem, phrased as one line a person can act on.

    ``issues``: pydantic's error list (``loc``, ``type``, ``msg``, ``input``, ``ctx``) when the
    schema refused the values, so a front end can name each field as the user spelled it
    (``fedcure_app.cli.errors``); empty otherwise."""

    def __init__(self, message: str, issues: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.issues: list[dict[str, Any]] = list(issues or [])


def _one_line(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "config"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            home = flat_keys().get(_alias(str(e["loc"][-1])))
            if home is not None and (len(e["loc"]) == 1 or home[0] != e["loc"][0]):
                msg += f"; it belongs under [{home[0]}]"
        parts.append(f"{loc}: {msg}")
    return "invalid configuration: " + "; ".join(parts)


def build_config(data: dict[str, Any] | None = None) -> FedCureConfig:
    """Validate a nested mapping into a :class:`FedCureConfig`, raising :class:`ConfigError`."""
    try:
        return FedCureConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(_one_line(err), err.errors(include_url=False)) from None


def load_config(path: str | Path) -> FedCureConfig:
    """Read a TOML or JSON configuration file (sections ``method``, ``federation``, ``data``, ``run``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"configuration file not found: {p}")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text())
        else:
            data = tomllib.loads(p.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"cannot parse {p}: {err}") from None
    return build_config(data)


#: Flat (Flower run-config style) key -> (section, field) for every knob.
def flat_keys() -> dict[str, tuple[str, str]]:
    """Map every hyphenated flat key (``num-clients``) to its (section, field)."""
    out: dict[str, tuple[str, str]] = {}
    for section, model in FedCureConfig.model_fields.items():
        sub = model.annotation
        if section == "task":  # a task comes whole from a task file, not key by key
            continue
        for name in sub.model_fields:  # type: ignore[union-attr]
            out[_alias(name)] = (section, name)
    return out


def apply_flat(cfg: FedCureConfig, flat: dict[str, Any]) -> FedCureConfig:
    """Return a copy of ``cfg`` with flat overrides (``{"num-clients": 10}``) applied and checked.

    The key ``method`` (a preset name such as ``fedcure``) is also accepted. Unknown keys raise
    :class:`ConfigError`.
    """
    keys = flat_keys()
    data = cfg.model_dump()
    preset = None
    for key, value in flat.items():
        k = key.replace("_", "-")
        if k == "method":
            preset = str(value)
            continue
        if k not in keys:
            raise ConfigError(f"unknown configuration key {key!r}")
        section, name = keys[k]
        data[section][name] = value
    out = build_config(data)
    return out.with_method_preset(preset) if preset else out
