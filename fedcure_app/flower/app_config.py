"""Flower run-config ↔ :class:`~fedcure_app.config.FedCureConfig`, shared by both Flower apps.

Under ``flwr run`` both the ServerApp and every ClientApp see ``context.run_config``: the
``[tool.flwr.app.config]`` table of ``pyproject.toml`` with the ``--run-config`` overrides fused
in. Its keys are the flat configuration keys of :func:`fedcure_app.config.apply_flat`
(``num-clients``, ``tau-e``, ``method``…) plus a few *app options* that are not method knobs
(:data:`APP_OPTION_DEFAULTS`: ``out-dir``, ``run-folders``, ``debug``, ``role``, ``cpufreq``,
timeouts).

Flower's run config holds only bool/int/float/str, so "unset" is spelled in-band:

- ``""`` for the optional strings (``data-dir``, ``profiles-file``, ``formation``, ``scheduler``)
  and for ``mix`` (a comma-separated list of device presets, ``""`` = every preset);
- ``0`` for ``max-concurrent`` (= ⌈M/2⌉);
- ``edge-access-mbps`` is a comma-separated list of numbers (``""`` = no caps).

``formation``/``scheduler``, when set, are applied *after* the ``method`` preset, so
``--run-config "method='fedcure' scheduler='random'"`` means FedCure's coalitions with a random
scheduler.

This module also holds what a ClientApp must compute exactly as
:func:`fedcure_app.simulation.engine.build_federation` does (the partition and the simulated
device population), so that client id ``n`` under Flower holds the same data and device as
client ``n`` in-process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcure_app.config import ConfigError, FedCureConfig, apply_flat

#: Run-config keys that are not FedCure configuration knobs, with their defaults.
APP_OPTION_DEFAULTS: dict[str, Any] = {
    # where the ServerApp writes result.json and the plots (relative: to its working directory)
    "out-dir": "results/flwr",
    # each run writes to out-dir/<run id>/ and a finished one updates out-dir/latest
    # (fedcure_app.flower.run_folders); false: straight into out-dir
    "run-folders": True,
    # a failed run: FedCure's one line only (false), or also Flower's traceback (true)
    "debug": False,
    # what the ServerApp runs: "simulation" (the whole hierarchy on a simulated clock);
    # "edge" (deployment: one ES serving its coalition for the cloud, started by fedcure-edge)
    "role": "simulation",
    # how a ClientApp applies its frequency directive: "emulate" | "sysfs" | "off"
    # (a SuperNode's node-config key "cpufreq" overrides it)
    "cpufreq": "emulate",
    # seconds an edge round waits for its clients' replies (0 = no limit)
    "edge-timeout": 0.0,
    # seconds between two pulls of the replies
    "poll-interval": 0.01,
    # seconds to wait for the SuperNodes to register (and answer the id query)
    "discovery-timeout": 120.0,
    # role "edge": the JSON file fedcure-edge writes for its ServerApp (cloud address, edge id,
    # advertised address, token, TLS files; see edge_server.settings)
    "edge-file": "",
    # role "simulation": a model.pt / model.pt2 / safetensors file of the run's model to start
    # from instead of a seeded fresh one ("": fresh; relative: to the ServerApp's directory)
    "init-model": "",
}

#: The only keys whose value in ``pyproject.toml``'s ``[tool.flwr.app.config]`` differs from
#: :class:`~fedcure_app.config.FedCureConfig`'s default: the size of ``flwr run .``'s demo on
#: the bundled digits (10 clients over a Dirichlet split, 3 edges, 10 rounds, about a minute).
#: Every method knob there is the configuration's default, so a task trains alike under
#: ``fedcure simulate``, ``fedcure launch``, the roles and ``flwr run`` (under a task the number
#: of clients follows the clients folder; name ``global-rounds`` as ``--rounds``).
DEMO_SIZE_KEYS = ("partition", "num-clients", "num-edges", "global-rounds")

#: Optional string knobs for which ``""`` means "unset".
_EMPTY_IS_UNSET = ("data-dir", "profiles-file", "formation", "scheduler", "method", "mix",
                   "calibrate-prior", "warmup-tasks", "clients-data", "task",
                   # simulator-only numbers whose unset default is None (the peers, the budget)
                   "eval-every-s", "time-budget-s", "buffer-k", "concurrency", "tiers")
ROLES = ("simulation", "edge")


@dataclass(frozen=True)
class AppOptions:
    """The non-configuration run-config keys, typed (see :data:`APP_OPTION_DEFAULTS`)."""

    out_dir: str = APP_OPTION_DEFAULTS["out-dir"]
    run_folders: bool = True
    debug: bool = False
    role: str = APP_OPTION_DEFAULTS["role"]
    cpufreq: str = APP_OPTION_DEFAULTS["cpufreq"]
    edge_timeout_s: float | None = None
    poll_interval_s: float = APP_OPTION_DEFAULTS["poll-interval"]
    discovery_timeout_s: float = APP_OPTION_DEFAULTS["discovery-timeout"]
    edge_file: str = ""
    init_model: str = ""


def _norm(key: str) -> str:
    return key.replace("_", "-")


def flag(value: Any, key: str) -> bool:
    """A run-config boolean: ``true``/``false`` (TOML), also ``1``/``0`` and their strings."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ConfigError(f"{key} must be true or false, got {value!r}")


def app_options(run_config: Mapping[str, Any]) -> AppOptions:
    """The app options of a run config (defaults where absent), checked."""
    rc = {_norm(k): v for k, v in run_config.items()}
    get = lambda k: rc.get(k, APP_OPTION_DEFAULTS[k])  # noqa: E731
    role = str(get("role"))
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    cpufreq = str(get("cpufreq"))
    if cpufreq not in ("emulate", "sysfs", "cgroup", "off"):
        raise ConfigError(f"unknown cpufreq {cpufreq!r}; choose emulate, sysfs, cgroup or off")
    try:
        timeout = float(get("edge-timeout"))
        poll = float(get("poll-interval"))
        discovery = float(get("discovery-timeout"))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid app option: {err}") from None
    if timeout < 0 or poll <= 0 or discovery <= 0:
        raise ConfigError(
            "edge-timeout must be >= 0 (0 = no limit), poll-interval and discovery-timeout > 0"
        )
    out_dir = str(get("out-dir")) or APP_OPTION_DEFAULTS["out-dir"]
    return AppOptions(
        out_dir=out_dir, run_folders=flag(get("run-folders"), "run-folders"),
        debug=flag(get("debug"), "debug"), role=role, cpufreq=cpufreq,
        edge_timeout_s=timeout if timeout > 0 else None,
        poll_interval_s=poll, discovery_timeout_s=discovery,
        edge_file=str(get("edge-file") or ""), init_model=str(get("init-model") or ""),
    )


def config_from_run_config(
    run_config: Mapping[str, Any], base: FedCureConfig | None = None
) -> FedCureConfig:
    """The :class:`FedCureConfig` described by a Flower run config.

    App options (:data:`APP_OPTION_DEFAULTS`) are skipped; unknown keys raise
    :class:`~fedcure_app.config.ConfigError` (via :func:`apply_flat`).
    """
    flat: dict[str, Any] = {}
    for key, value in run_config.items():
        k = _norm(key)
        if k in APP_OPTION_DEFAULTS:
            continue
        if k in _EMPTY_IS_UNSET and (value is None or value == ""):
            continue
        if k == "max-concurrent" and value in (0, None):
            continue
        if k == "mix":
            value = [s.strip() for s in str(value).split(",") if s.strip()]
        if k == "edge-access-mbps":
            value = _floats(k, value)
        flat[k] = value
    late = {k: flat.pop(k) for k in ("formation", "scheduler") if k in flat}
    task = flat.pop("task", None)
    cfg = apply_flat(base or FedCureConfig(), flat)
    cfg = apply_flat(cfg, late) if late else cfg
    if task is not None:
        from fedcure_app.data.own_federation import with_task
        from fedcure_app.data.task import load_task, parse_task

        text = str(task).strip()
        cfg = with_task(cfg, parse_task(json.loads(text), "run config task")
                        if text.startswith("{") else load_task(text))
    return cfg


def _floats(key: str, value: Any) -> list[float]:
    """A comma-separated list of numbers from the run config (``""``: an empty list)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    try:
        return [float(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{key}: expected comma-separated numbers, got {value!r}") from None


def data_key(cfg: FedCureConfig) -> tuple:
    """What a client's data depend on: equal keys, equal partitions (a cache key)."""
    d, f = cfg.data, cfg.federation
    task = None if cfg.task is None else cfg.task.model_dump_json()
    return (d.dataset, d.data_dir, d.partition, d.dirichlet_alpha, d.shards_per_client,
            d.classes_per_edge, f.num_clients, f.num_edges, cfg.run.seed, task, d.clients_data,
            d.holdout, d.label_column)


def client_key(cfg: FedCureConfig) -> tuple:
    """What a ClientApp's data *and* simulated device depend on."""
    dev = cfg.devices
    return data_key(cfg) + (tuple(dev.mix) if dev.mix else None, dev.profiles_file)


def client_fingerprint(cfg: FedCureConfig) -> str:
    """A short digest of :func:`client_key`: the ServerApp sends it with every task, and a
    ClientApp whose run config describes different clients refuses to train."""
    import hashlib

    return hashlib.blake2b(repr(client_key(cfg)).encode(), digest_size=8).hexdigest()


def default_run_config() -> dict[str, Any]:
    """A complete flat run config with every knob at its default (for tests and helpers).

    Mirrors what ``[tool.flwr.app.config]`` may hold: every configuration key plus the app
    options, with "unset" spelled as described in the module docstring.
    """
    return run_config_from_config(FedCureConfig())


def run_config_from_config(cfg: FedCureConfig) -> dict[str, Any]:
    """The flat Flower run config that describes ``cfg`` (inverse of :func:`config_from_run_config`
    for every knob), plus the app options at their defaults."""
    from fedcure_app.config import flat_keys

    out: dict[str, Any] = {"method": ""}
    for key, (section, name) in flat_keys().items():
        value = getattr(getattr(cfg, section), name)
        if value is None:
            value = 0 if key == "max-concurrent" else ""
        elif isinstance(value, list):
            value = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        out[key] = value
    # a task travels inline, as JSON (a run-config value may also name a task file)
    out["task"] = "" if cfg.task is None else cfg.task.model_dump_json(by_alias=True)
    out.update(APP_OPTION_DEFAULTS)
    return out


__all__ = [
    "APP_OPTION_DEFAULTS", "AppOptions", "DEMO_SIZE_KEYS", "app_options", "client_fingerprint", "client_key", "flag",
    "run_config_from_config",
    "config_from_run_config", "data_key",
    "default_run_config",
]
