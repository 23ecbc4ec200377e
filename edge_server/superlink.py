"""The Flower side of an edge: its own SuperLink, and the edge ServerApp submitted to it.

Flower 1.41 serves the Fleet, Control and runtime (ServerAppIo) APIs over HTTP on one address
(``--host``/``--port``): that is the edge's ``--listen``, where its clients' SuperNodes connect.
The SuperLink still opens its legacy gRPC Fleet and Control servers (ports 9092 and 9093 by
default); they are put on free 127.0.0.1 ports so that several edges share a host.

Every Flower process runs with :data:`fedcure_app.runtime.processes.FLOWER_OFFLINE_ENV` and a
private ``FLWR_HOME`` inside the edge's work directory, whose ``config.toml`` names one SuperLink
connection, ``fedcure-edge``, for ``flwr run``. The app directory holds only a generated
``pyproject.toml`` (components = the installed edge ServerApp :mod:`edge_server.app` and the
FedCure ClientApp, run config = defaults with ``role = "edge"`` and ``edge-file``).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcure_app.flower.tools import flower_bin
from fedcure_app.flower.tools import write_app_dir as write_flower_app_dir
from fedcure_app.runtime.processes import Child, flower_env, free_ports, port_open

log = logging.getLogger("fedcure.edge")

CONNECTION = "fedcure-edge"
#: ``module:attribute`` of the edge ServerApp (:mod:`edge_server.app`) that the edge submits.
EDGE_SERVERAPP = "edge_server.app:app"
#: seconds between the edge SuperExec's asks for a ServerApp to start (Flower's own default):
#: it starts the one edge ServerApp once, but keeps asking for as long as the edge lives, and
#: at FedCure's 50 ms for other Flower processes those asks cost the SuperLink 0.1 core
SUPEREXEC_POLL_S = "1.0"


class SuperLinkError(RuntimeError):
    """The SuperLink did not start, or the ServerApp could not be submitted (one line)."""


@dataclass(frozen=True)
class TLSFiles:
    """The SuperLink's server certificate, key and CA (PEM paths)."""

    cert: str
    key: str
    ca: str


def write_flwr_home(home: Path, address: str, tls: TLSFiles | None) -> Path:
    """A private ``FLWR_HOME`` whose config.toml points ``flwr`` at this edge's SuperLink."""
    import tomli_w

    home.mkdir(parents=True, exist_ok=True)
    conn: dict[str, Any] = {"address": address}
    if tls is None:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(Path(tls.ca).resolve())
    doc = {"superlink": {"default": CONNECTION, CONNECTION: conn}}
    path = home / "config.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def write_app_dir(path: Path, run_config: dict[str, Any]) -> Path:
    """The generated Flower App directory (just a pyproject.toml) for ``flwr run``: the edge
    ServerApp (:mod:`edge_server.app`) and the FedCure ClientApp."""
    return write_flower_app_dir(path, run_config, serverapp=EDGE_SERVERAPP)


def edge_run_config(edge_file: Path) -> dict[str, Any]:
    """The run config of the edge ServerApp: every key at its default, role edge, edge-file."""
    from fedcure_app.flower.app_config import default_run_config

    rc = default_run_config()
    rc.pop("executor", None)
    rc["role"] = "edge"
    rc["edge-file"] = str(edge_file.resolve())
    return rc


def superlink_argv(host: str, port: int, tls: TLSFiles | None,
                   supernode_auth: bool = False) -> list[str]:
    """``flower-superlink`` on ``host:port``; legacy gRPC servers on free loopback ports;
    ``supernode_auth``: only registered SuperNodes may connect (needs ``tls``)."""
    fleet, control = free_ports(2)
    argv = ["flower-superlink", "--host", host, "--port", str(port),
            "--fleet-api-address", f"127.0.0.1:{fleet}",
            "--control-api-address", f"127.0.0.1:{control}",
            "--disable-runtime-dependency-installation"]
    if tls is None:
        argv.append("--insecure")
    else:
        argv += ["--ssl-certfile", tls.cert, "--ssl-keyfile", tls.key,
                 "--ssl-ca-certfile", tls.ca]
    if supernode_auth:
        if tls is None:
            raise SuperLinkError("SuperNode authentication needs TLS")
        argv.append("--enable-supernode-auth")
    return argv


def superlink_env(work: Path) -> dict[str, str]:
    """The environment of the edge's SuperLink: Flower offline, its home in ``work``, and its
    SuperExec asking for ServerApps every :data:`SUPEREXEC_POLL_S` seconds."""
    return flower_env(work / "flwr-home", {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": SUPEREXEC_POLL_S})


def start_superlink(work: Path, host: str, port: int, tls: TLSFiles | None,
                    timeout_s: float = 180.0, supernode_auth: bool = False) -> Child:
    """Start the SuperLink (log in ``work/superlink.log``) and wait until it accepts
    connections; :class:`SuperLinkError` when it dies or does not come up."""
    argv = superlink_argv(host, port, tls, supernode_auth)
    # Flower's SuperLink with held pulls (edge_server.held_superlink), same arguments
    argv[:1] = [sys.executable, "-m", "edge_server.held_superlink"]
    child = Child("flower-superlink", argv, log_path=work / "superlink.log",
                  env=superlink_env(work), cwd=work)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if child.poll() is not None:
            raise SuperLinkError(
                f"flower-superlink exited with code {child.proc.returncode} before serving "
                f"{host}:{port}; its log ends with:\n{child.tail()}")
        if port_open(host, port) and "Uvicorn running" in (child.tail(40) or ""):
            return child
        time.sleep(0.1)
    child.stop()
    raise SuperLinkError(f"flower-superlink did not serve {host}:{port} within {timeout_s:.0f} s")


def submit_run(work: Path, app_dir: Path, timeout_s: float = 120.0) -> int:
    """``flwr run APP fedcure-edge --format json``; return the run id."""
    argv = [flower_bin("flwr"), "run", str(app_dir), CONNECTION, "--format", "json"]
    try:
        out = subprocess.run(argv, env=flower_env(work / "flwr-home"), cwd=work,
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SuperLinkError(f"`flwr run` did not return within {timeout_s:.0f} s") from None
    text = (out.stdout or "") + (out.stderr or "")
    (work / "flwr-run.log").write_text(text)
    run_id = _run_id(out.stdout or "")
    if out.returncode != 0 or run_id is None:
        reason = _error_message(out.stdout or "") or (
            text.strip().splitlines()[-1] if text.strip() else "no output")
        raise SuperLinkError(f"`flwr run` failed (code {out.returncode}): {reason}")
    return run_id


def _answer(stdout: str) -> dict[str, Any] | None:
    """The JSON object ``flwr run --format json`` printed (from its first ``{``), if any."""
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(stdout[start:])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _error_message(stdout: str) -> str | None:
    """The answer's ``error-message`` on one line, when it has one."""
    msg = (_answer(stdout) or {}).get("error-message")
    return " ".join(str(msg).split()) or None if msg else None


def _run_id(stdout: str) -> int | None:
    data = _answer(stdout) or {}
    for key in ("run-id", "run_id"):
        if key in data:
            try:
                return int(data[key])
            except (ValueError, TypeError):
                break
    m = re.search(r"run[ -_]?(?:id)?\D{0,4}(\d{6,})", stdout, re.I)
    return int(m.group(1)) if m else None


__all__ = ["CONNECTION", "EDGE_SERVERAPP", "SuperLinkError", "TLSFiles", "edge_run_config",
           "start_superlink", "submit_run", "superlink_argv", "write_app_dir", "write_flwr_home"]
