"""``fedcure testbed --peer fedavg``: FedCure against Flower's own FedAvg on the same devices.

    sudo fedcure testbed --peer fedavg --out DIR [--against FEDCURE_DIR] [--peer-rounds R]
        [--fraction C] [--target A] [testbed options]

1. Unless ``--against`` names a finished ``fedcure testbed`` run, runs FedCure's testbed with
   the given options into ``DIR/fedcure`` (evaluating the global model after every global round
   unless ``--eval-every`` says otherwise).
2. Runs flat synchronous FedAvg into ``DIR/fedavg`` on the same testbed: the same namespaces,
   shaped links, device profiles and scaling (the host's speed FedCure's run measured), CPU
   quotas and data partition; one stock ``flower-superlink`` in the cloud's namespace, every
   client a stock ``flower-supernode`` in its own, the App of
   :mod:`fedcure_app.flower.peer_fedavg` (Flower's ``FedAvg``; FedCure's ClientApp training
   ``τ_c`` steps a round at f_max) submitted with ``flwr run``; ``--peer-rounds`` rounds
   (default: FedCure's global rounds).
3. Writes ``DIR/peers.json`` and ``DIR/peers.md`` (:mod:`fedcure_app.testbed.peer_table`):
   per method the wall-clock time to the target (``--target``, else 0.9 × the better final
   accuracy), the final accuracy, the accuracy when the shorter run ended, rounds and client
   steps, and prints the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedcure_app.cli.errors import UsageError
from fedcure_app.config import FedCureConfig

log = logging.getLogger(__name__)

#: the SuperLink's HTTP port (Fleet, Control and ServerAppIo) and its legacy gRPC ports, all
#: inside the cloud's namespace, which holds nothing else
SUPERLINK_PORT, FLEET_GRPC_PORT, CONTROL_GRPC_PORT = 9190, 9192, 9193
#: the ``flwr`` connection name in the run's private FLWR_HOME
CONNECTION = "testbed"
#: seconds the SuperLink may take to serve, and each partition cut
START_TIMEOUT_S, CUT_TIMEOUT_S = 180.0, 600.0


def add_peer_options(p: argparse.ArgumentParser) -> None:
    """``fedcure testbed``'s options for a run against a peer."""
    p.add_argument("--peer", choices=["fedavg"],
                   help="also run this peer on the same testbed and compare time to target: "
                        "fedavg (Flower's own FedAvg strategy on one SuperLink)")
    p.add_argument("--against", metavar="DIR",
                   help="with --peer: the finished `fedcure testbed` run to compare with "
                        "(default: run it first, into OUT/fedcure)")
    p.add_argument("--peer-rounds", type=int, metavar="R",
                   help="with --peer: the peer's rounds (default: --rounds)")
    p.add_argument("--fraction", type=float, default=1.0, metavar="C",
                   help="with --peer fedavg: fraction of the clients each round (Flower's "
                        "fraction_train; default 1.0)")
    p.add_argument("--target", type=float, metavar="A",
                   help="with --peer: target test accuracy in (0, 1] (default: 0.9 × the "
                        "better method's final accuracy)")


def check_peer_options(args: argparse.Namespace) -> None:
    """The peer options' own mistakes (:class:`UsageError`), before anything starts."""
    if args.peer is None:
        for name in ("against", "peer_rounds", "target"):
            if getattr(args, name) is not None:
                raise UsageError(f"--{name.replace('_', '-')} needs --peer")
        return
    if getattr(args, "task", None) is not None:
        raise UsageError("--peer runs on a built-in dataset only, not --task")
    if not 0 < args.fraction <= 1:
        raise UsageError(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.target is not None and not 0 < args.target <= 1:
        raise UsageError(f"--target must be in (0, 1], got {args.target}")
    if args.peer_rounds is not None and args.peer_rounds < 1:
        raise UsageError(f"--peer-rounds must be >= 1, got {args.peer_rounds}")
    if args.against and not (Path(args.against) / "result.json").is_file():
        raise UsageError(f"--against {args.against}: no result.json there (a finished "
                         "`fedcure testbed` run's folder)")


def _sub_args(args: argparse.Namespace, out: Path, **changes: Any) -> argparse.Namespace:
    sub = copy.copy(args)
    sub.out = str(out)
    for k, v in changes.items():
        setattr(sub, k, v)
    return sub


def run(args: argparse.Namespace, site_class: Callable[[argparse.Namespace], Any]) -> int:
    """FedCure's testbed run (unless ``--against``), the peer's, then the table; each run on
    its own ``site_class(options)`` (:class:`fedcure_app.cli.testbed.NamespaceSite`)."""
    from fedcure_app.cli import launch

    NamespaceSite = site_class  # noqa: N806 - a class

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    fedcure_dir = Path(args.against).resolve() if args.against else out / "fedcure"
    if not args.against:
        every = 1 if args.eval_every is None else args.eval_every
        code = launch.run(_sub_args(args, fedcure_dir, eval_every=every),
                          NamespaceSite(_sub_args(args, fedcure_dir)))
        if code != 0:
            return code
    fedcure = json.loads((fedcure_dir / "result.json").read_text())
    spacing = (fedcure.get("config", {}).get("run") or {}).get("eval-every", 1)
    if spacing != 1:
        log.warning("the FedCure run evaluated every %s global rounds, the peer evaluates every "
                    "round: FedCure's time to target is read coarser (run it with "
                    "--eval-every 1)", spacing)
    host_sps = (_read_json(fedcure_dir / "testbed.json") or {}).get("host_samples_per_s")
    peer_dir = out / args.peer
    sub = _sub_args(args, peer_dir, host_samples_per_s=host_sps or args.host_samples_per_s,
                    no_dashboard=True)
    cfg = launch.config_from_args(sub)
    rounds = args.peer_rounds or cfg.run.global_rounds
    try:
        peer = run_fedavg(sub, cfg, NamespaceSite(sub), rounds)
    except (RuntimeError, OSError) as err:
        print(f"fedcure testbed --peer {args.peer}: error: {err}", file=sys.stderr)
        return 1
    return write_comparison(out, {"fedcure": _fedcure_summary(fedcure, fedcure_dir),
                                  args.peer: peer}, args.target)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _applied(work: Path) -> list[dict[str, Any]]:
    """Every train message's entry the ClientApps logged beside their node data files."""
    rows = []
    for f in sorted(work.glob("client*/*.applied.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def _client_work(applied: list[dict[str, Any]], tau_c: int) -> dict[str, Any]:
    """Client steps, train messages, and their mean seconds: ClientApp start to reply, and
    training alone."""
    spans = [a["finished_at"] - a["app_started_at"] for a in applied
             if a.get("app_started_at") is not None]
    return {"client_steps": tau_c * len(applied), "client_tasks": len(applied),
            "mean_clientapp_s": sum(spans) / len(spans) if spans else None,
            "mean_train_s": (sum(float(a["measured_s"]) for a in applied) / len(applied)
                             if applied else None)}


def _fedcure_summary(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    from fedcure_app.config import build_config

    tau_c = build_config(result["config"]).method.tau_c
    return {"method": "fedcure", "records": result["records"], "rounds": result["rounds"],
            **_client_work(_applied(folder / "work"), tau_c)}


def write_comparison(out: Path, runs: dict[str, dict[str, Any]], target: float | None) -> int:
    """``peers.json`` and ``peers.md`` in ``out``; prints the table; 0."""
    from rich.console import Console
    from rich.markdown import Markdown

    from fedcure_app.testbed.peer_table import comparison, markdown

    table = comparison(runs, target)
    for row in table["rows"]:
        extra = runs[row["method"]]
        row.update({k: extra.get(k) for k in ("client_tasks", "mean_clientapp_s",
                                              "mean_train_s", "strategy")})
    (out / "peers.json").write_text(json.dumps(table, indent=1))
    text = markdown(table)
    (out / "peers.md").write_text(text)
    Console(stderr=True).print(Markdown(text))
    print(f"comparison in {out / 'peers.json'} and {out / 'peers.md'}", file=sys.stderr)
    return 0


def cut_partitions(cfg: FedCureConfig, work: Path) -> list[Path]:
    """Every client's node data file, cut as a FedCure client cuts its own
    (``python -m client.partition``, all at once); RuntimeError naming the first failure."""
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "partition-config.json"
    config_file.write_text(json.dumps(cfg.model_dump(mode="json")))
    files = [work / f"client{i}" / "node-data.npz" for i in range(cfg.federation.num_clients)]
    procs = []
    for i, f in enumerate(files):
        f.parent.mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "client.partition", "--config", str(config_file), "--index",
             str(i), "--name", f"client-{i}", "--out", str(f)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=CUT_TIMEOUT_S)
        if p.returncode != 0:
            raise RuntimeError(f"cutting partition {i} failed: {err.strip()[-300:]}")
    return files


def _flwr_home(home: Path, address: str) -> dict[str, str]:
    """Flower offline with its home in ``home`` (whose config.toml names the SuperLink for
    ``flwr run``), and Flower's own SuperExec poll interval, not FedCure's shorter one."""
    import tomli_w

    from fedcure_app.runtime.processes import flower_env

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(tomli_w.dumps(
        {"superlink": {"default": CONNECTION, CONNECTION: {"address": address,
                                                           "insecure": True}}}))
    env = flower_env(home)
    env.pop("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", None)
    return env


def node_config(client: int, data_file: Path, site: Any) -> str:
    """The SuperNode's node config: FedCure's ClientApp reads its data file and CPU quota."""
    conf = f'client-id={client} data-file="{data_file}"'
    if site.args.cpufreq == "cgroup":
        return conf + (f' cpufreq="cgroup" host-samples-per-s={float(site.host_sps)}'
                       f' cgroup-prefix="{site.prefix}"')
    return conf + f' cpufreq="{site.args.cpufreq}"'


def run_fedavg(args: argparse.Namespace, cfg: FedCureConfig, site: Any, rounds: int
               ) -> dict[str, Any]:
    """The peer's whole run on ``site`` (set up and torn down here); its summary, also written
    to ``args.out``/result.json."""
    from fedcure_app.flower.peer_fedavg import CLIENTAPP, SERVERAPP
    from fedcure_app.flower.tools import flower_bin, write_app_dir
    from fedcure_app.runtime.processes import Child

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logs, work = out / "logs", out / "work"
    records, done, named = out / "records.jsonl", out / "done.json", out / "strategy.json"
    for f in (records, done, named):
        f.unlink(missing_ok=True)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT,
                                                                      signal.SIGTERM)}
    children: list[Any] = []
    started = time.monotonic()
    try:
        cfg = site.setup(cfg, out)
        files = cut_partitions(cfg, work)
        address = f"{site.host('cloud')}:{SUPERLINK_PORT}"
        link = Child("superlink", site.wrap("cloud", [
            flower_bin("flower-superlink"), "--host", site.host("cloud"), "--port",
            str(SUPERLINK_PORT), "--fleet-api-address", f"127.0.0.1:{FLEET_GRPC_PORT}",
            "--control-api-address", f"127.0.0.1:{CONTROL_GRPC_PORT}", "--insecure",
            "--disable-runtime-dependency-installation"]), log_path=logs / "superlink.log",
            env=_flwr_home(work / "superlink", address), cwd=work)
        children.append(link)
        _wait_serving(link, site, address)
        for i, f in enumerate(files):
            env = dict(_flwr_home(work / f"client{i}" / "flwr-home", address),
                       OMP_NUM_THREADS=str(args.threads))
            children.append(Child(f"client{i}", site.wrap(f"client{i}", [
                flower_bin("flower-supernode"), "--superlink", address, "--insecure",
                "--node-config", node_config(i, f, site)]), log_path=logs / f"client{i}.log",
                env=env, cwd=work / f"client{i}"))
        app = write_app_dir(out / "app", {
            "dataset": cfg.data.dataset, "data-dir": cfg.data.data_dir or "",
            "num-clients": cfg.federation.num_clients, "num-rounds": rounds,
            "fraction": float(args.fraction), "tau-c": cfg.method.tau_c, "lr": cfg.method.lr,
            "batch-size": cfg.method.batch_size, "seed": cfg.run.seed,
            "records-file": str(records), "done-file": str(done),
            "strategy-file": str(named)},
            serverapp=SERVERAPP, clientapp=CLIENTAPP)
        submit = subprocess.run(site.wrap("cloud", [flower_bin("flwr"), "run", str(app),
                                                    CONNECTION, "--format", "json"]),
                                env=_flwr_home(work / "flwr-cli", address),
                                capture_output=True, text=True, timeout=START_TIMEOUT_S)
        (logs / "flwr-run.log").write_text(submit.stdout + submit.stderr)
        if submit.returncode != 0:
            raise RuntimeError(f"`flwr run` failed (code {submit.returncode}); see "
                               f"{logs / 'flwr-run.log'}")
        log.info("Flower's FedAvg submitted to %s: %d clients, %d rounds", address,
                 cfg.federation.num_clients, rounds)
        stopped = _wait_done(link, records, done, rounds, args.timeout, stop)
    finally:
        _stop_all(children[1:])  # the SuperNodes together (each may wait out its grace)
        _stop_all(children[:1])  # then the SuperLink
        site.teardown()
        for s, handler in previous.items():
            signal.signal(s, handler)
        (out / "testbed.json").write_text(json.dumps(
            {**site.record(), "wall_seconds": time.monotonic() - started,
             "exit_codes": {c.name: c.proc.returncode for c in children}},
            indent=1, default=str))
    rows = _rows(records)
    if stopped:
        log.warning("Flower's FedAvg %s at round %d of %d; the table uses the rounds made",
                    stopped, max((r["round"] for r in rows), default=0), rounds)
    summary = {"method": "fedavg", "strategy": (_read_json(named) or {}).get("strategy"),
               "records": rows, "complete": done.is_file(), "stopped": stopped or None,
               "rounds": max((r["round"] for r in rows), default=0),
               "config": cfg.model_dump(mode="json"), "fraction": float(args.fraction),
               **_client_work(_applied(work), cfg.method.tau_c)}
    (out / "result.json").write_text(json.dumps(summary, indent=1))
    return summary


def _stop_all(children: list[Any], grace_s: float = 5.0) -> None:
    threads = [threading.Thread(target=c.stop, args=(grace_s,)) for c in children]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _wait_serving(link: Any, site: Any, address: str) -> None:
    host, port = address.rsplit(":", 1)
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if link.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {link.proc.returncode}: "
                               f"{link.tail(3)}")
        if site.port_open("cloud", host, int(port)):
            return
        time.sleep(0.2)
    raise RuntimeError(f"flower-superlink did not serve {address} in {START_TIMEOUT_S:.0f} s")


def _rows(records: Path) -> list[dict[str, Any]]:
    if not records.is_file():
        return []
    return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]


def _wait_done(link: Any, records: Path, done: Path, rounds: int, timeout_s: float,
               stop: threading.Event) -> str:
    """Until the ServerApp writes ``done``, printing each evaluated round; then "", or why it
    stopped waiting: ``timeout_s`` (0: none) or a signal. RuntimeError when the SuperLink
    exits."""
    end = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
    shown, why = 0, ""
    while True:
        finished = done.is_file()
        rows = _rows(records)
        for r in rows[shown:]:
            print(f"fedavg round {r['round']}/{rounds}: accuracy {100 * r['accuracy']:.1f} % "
                  f"at {r['time_s']:.1f} s", file=sys.stderr, flush=True)
        shown = len(rows)
        if finished:
            return ""
        if why:
            return why
        if link.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {link.proc.returncode}")
        if stop.is_set():
            why = "was stopped"
        elif time.monotonic() > end:
            why = f"timed out after {timeout_s:.0f} s"
        else:
            stop.wait(1.0)


__all__ = ["add_peer_options", "check_peer_options", "cut_partitions", "node_config", "run",
           "run_fedavg", "write_comparison"]
