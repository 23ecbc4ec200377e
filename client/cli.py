"""``fedcure-client``: one client device of a FedCure deployment.

    fedcure-client --cloud HOST:PORT [--name NAME] [--dataset D] [--data-dir DIR] \\
        [--partition-id I --num-partitions N] [--cpufreq sysfs|emulate|cgroup|off] [--token T] \\
        [--cpufreq-root DIR] [--host-samples-per-s R] [--cgroup-prefix P] [--insecure] [--tls-ca FILE] [--work-dir DIR]
    fedcure-client --probe [--cpufreq-root DIR]

1. Claims its partition (``Association.Claim``, keyed by ``--name``, default the same every
   run: ``names.default_name``; ``--partition-id`` asks for a given one) and gets the cloud's
   configuration, from which it computes exactly the partition ``fedcure simulate`` would
   (:func:`fedcure_app.federation.partition_for`), its label counts, its initial ES and its
   simulated device profile, and writes its data file (:mod:`fedcure_app.flower.node_data`),
   both in a child process (:mod:`client.partition`: the dataset never enters this one).
2. Registers (``Association.Register``; it answers once coalition formation has run and the
   chosen ES is up) and learns its client id and its ES's address.
3. Starts ``flower-supernode`` to that
   ES with node config ``client-id=<id> cpufreq=<mode> data-file=<path>`` (and
   ``cpufreq-root=<dir>`` with ``--cpufreq-root``, ``host-samples-per-s`` and
   ``cgroup-prefix`` with ``--cpufreq cgroup``) on its own free
   ClientAppIo (runtime) port.
4. Polls ``Monitor.Status`` and exits 0 when the cloud reports training done (and on
   SIGTERM/SIGINT), stopping the SuperNode and everything it started.

``--runtime warm`` (the default) keeps torch, the model and the data loaded across messages:
the SuperNode runs through :mod:`client.supernode` (Flower's SuperNode with short idle waits)
with ``--isolation process``, and a long-lived :mod:`client.executor` (with its
:mod:`client.trainer`) takes its ClientApp tasks, authenticated by a secret in the 0700 work
directory; an executor that exits is started again. The executor starts before the client
registers (its trainer loads torch, the model and the data file and warms up while the cloud
forms coalitions) and learns the SuperNode's runtime port from ``runtime-api-address`` in the
work directory once the SuperNode is started; the SuperNode too is started before registering
(without ``--supernode-auth``), imports Flower and waits for its arguments in
``supernode-argv.json``. So the first task costs training, not start-up.
``--runtime flower`` is Flower's own path
(``flower-supernode`` starting ``flower-superexec``, which starts a ``flwr-clientapp`` process
per message).

``--probe`` prints this machine's device profile (cores, cpufreq frequencies, governor, memory)
as JSON and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fedcure_app.errors import UsageError
from fedcure_app.protocol.text import printable
from fedcure_app.trained.names import counts_text, holding_text, run_classes

# the steps of a client, one module each; re-exported here (their old home)
from client.association import (
    ClientError,
    build_node_data,
    call,
    claim,
    config_of,
    register,
    withdraw,
)
from client.children import (
    CHILD_STOP_GRACE_S,
    RUN_END_GRACE_S,
    RUNTIME_ADDRESS_FILE,
    STATUS_EVERY_S,
    WATCH_EVERY_S,
    SUPERNODE_ARGV_FILE,
    prestart_supernode,
    publish_runtime_port,
    runtime_port_taken,
    release_supernode,
    start_executor,
    start_supernode,
    stop_children,
    supernode_argv,
)
from client.device import device_in_use, gpufreq_in_use, measure_rate, probe
from client.own_data import DataRefused, read_own_data
from client.partition import cut_partition

PROG = "fedcure-client"
log = logging.getLogger("fedcure.client")
#: flower-supernode exits in a row, each within QUICK_EXIT_S of its start, before the client gives
#: up (a SuperNode exits when its edge's SuperLink restarted and no longer knows its node id)
SUPERNODE_RESTARTS, QUICK_EXIT_S = 5, 30.0


def build_parser() -> argparse.ArgumentParser:
    from fedcure_app.errors import ArgumentParser, HelpFormatter

    p = ArgumentParser(prog=PROG, description="FedCure client: register with the "
                                "cloud, then run a Flower SuperNode to the assigned edge server.",
                                formatter_class=HelpFormatter)
    p.add_argument("--cloud", metavar="HOST:PORT",
                   help="the cloud's address (required unless --probe)")
    p.add_argument("--name", help="client name (default <host>-<data folder>|-p<I>, stable)")
    p.add_argument("--dataset", help="dataset the client holds; must match the cloud's "
                   "(default: the cloud's)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="root holding the dataset files (default: $FEDCURE_DATA_DIR, else ./data)")
    own = p.add_argument_group("own data (a cloud started with --task; docs/own-data.md)")
    own.add_argument("--data", metavar="PATH",
                     help="this device's own data: a folder of class folders (optionally "
                          "under train/ and test/), an .npz with x and y, a CSV with a label "
                          "column, or a datasets.save_to_disk folder; read under the task the "
                          "cloud sends (no --dataset, no partition)")
    own.add_argument("--allow-model", action="append", metavar="PATH[,PATH]", help="model "
                     "import paths (package.module:factory) the cloud's task may name; any "
                     "other is refused at Claim (built-ins need no consent; repeatable)")
    own.add_argument("--task", metavar="FILE", help="your own task file: allows its model")
    own.add_argument("--label-column", help="label column of CSV data (default: the cloud's, "
                     "label)")
    own.add_argument("--holdout", type=float, metavar="F",
                     help="fraction held out (seeded, stratified) for federated evaluation "
                          "when PATH has no test/ part (default: the cloud's, 0.1)")
    own.add_argument("--histogram-epsilon", type=float, metavar="E",
                     help="report the label histogram with Laplace noise of scale 1/E "
                          "(E-differential privacy of the histogram; 0: exact counts; "
                          "default: the cloud's histogram-epsilon, 0)")
    own.add_argument("--histogram-min-count", type=int, metavar="K",
                     help="report classes with fewer than K samples as 0 (default: the "
                          "cloud's histogram-min-count, 0)")
    p.add_argument("--partition-id", type=int, metavar="I",
                   help="ask for partition I (default: the cloud assigns one); with --data, "
                        "the client's place in the cloud's order (client id, initial edge)")
    p.add_argument("--num-partitions", type=int, metavar="N",
                   help="check that the cloud's configuration has N partitions")
    p.add_argument("--cpufreq", choices=["sysfs", "emulate", "cgroup", "off"],
                   default="emulate",
                   help="how the ClientApp applies CPU-frequency directives (default emulate; "
                        "cgroup: a CPU quota that makes this host compute at the device "
                        "profile's speed, needs root)")
    p.add_argument("--host-samples-per-s", type=float, default=0.0, metavar="R",
                   help="--cpufreq cgroup: this host's training samples/s on one core (default "
                        "0: measured once when the first task comes)")
    p.add_argument("--cgroup-prefix", default="fedcure", metavar="P",
                   help="--cpufreq cgroup: the trainer's cgroup is P-client<id>-<pid> "
                        "(default fedcure)")
    p.add_argument("--cpufreq-root", metavar="DIR",
                   help="the CPU sysfs folder holding cpuN/cpufreq/ that --cpufreq sysfs writes "
                        "and --probe reads (default the kernel's, /sys/devices/system/cpu)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"],
                   default=os.environ.get("FEDCURE_DEVICE") or "cpu",
                   help="where the trainer trains and evaluates (default cpu, or "
                        "$FEDCURE_DEVICE); cuda: the GPU torch sees (exit 2 without one); auto: "
                        "cuda when torch sees a GPU, else cpu")
    p.add_argument("--gpufreq", choices=["devfreq", "off", "preset"],
                   default=os.environ.get("FEDCURE_GPUFREQ") or "preset",
                   help="with --device cuda, how the frequency directive reaches the GPU clock: "
                        "devfreq pins the GPU devfreq device's min_freq/max_freq (needs write "
                        "access), off leaves it; preset (default): devfreq when the client's "
                        "device profile is a Jetson, else off")
    p.add_argument("--gpufreq-root", metavar="DIR",
                   help="the devfreq folder --gpufreq devfreq writes (default /sys/class/devfreq)")
    p.add_argument("--token", default=os.environ.get("FEDCURE_TOKEN", ""),
                   help="the cloud's shared secret (default $FEDCURE_TOKEN)")
    sec = p.add_argument_group("transport security (see `fedcure certs`)")
    sec.add_argument("--insecure", action="store_true",
                     help="plaintext to the cloud and to the edge (local testing only)")
    sec.add_argument("--tls-ca", metavar="FILE",
                     help="CA (PEM) that verifies the cloud and the edge's SuperLink")
    sec.add_argument("--tls-cert", metavar="FILE",
                     help="client certificate for mutual TLS with the cloud")
    sec.add_argument("--tls-key", metavar="FILE", help="its private key")
    sec.add_argument("--supernode-auth", action="store_true",
                     help="authenticate the SuperNode to the edge (Flower SuperNode "
                          "authentication, for edges started with --supernode-auth; needs "
                          "--tls-ca): a P-384 key pair is made in --work-dir and the public key "
                          "sent with Register")
    p.add_argument("--runtime", choices=["warm", "flower"],
                   default=os.environ.get("FEDCURE_CLIENT_RUNTIME") or "warm",
                   help="warm (default): one long-lived executor and trainer run every message "
                        "(torch, model and data stay loaded); flower: Flower starts a "
                        "flwr-clientapp process per message (default $FEDCURE_CLIENT_RUNTIME)")
    p.add_argument("--work-dir", metavar="DIR",
                   help="where the data file and the SuperNode's log go (default: temporary)")
    p.add_argument("--connect-timeout", type=float, default=60.0, metavar="S",
                   help="how long to wait for the cloud to answer at start (default 60)")
    p.add_argument("--register-timeout", type=float, default=900.0, metavar="S",
                   help="how long to wait for coalition formation (default 900)")
    p.add_argument("--cloud-lost-timeout", type=float, default=60.0, metavar="S",
                   help="exit with an error when the cloud stays unreachable this long while "
                        "training (default 60)")
    p.add_argument("--probe", action="store_true",
                   help="print this device's profile (JSON) and exit; with --dataset or a "
                        "--device other than cpu also the device's measured training rate "
                        "(samples/s) on the dataset's model")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p


def run_client(args: argparse.Namespace, stop: threading.Event) -> int:
    from fedcure_app.flower.node_data import read_applied
    from fedcure_app.runtime.processes import Child, flower_env, free_port, split_address
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.channel import check_security, open_channel

    if not args.cloud:
        raise UsageError("--cloud HOST:PORT is required (or --probe)")
    split_address(args.cloud, "--cloud")
    if args.insecure and (args.tls_ca or args.tls_cert or args.tls_key):
        raise UsageError("--insecure cannot be combined with --tls-* files")
    if args.supernode_auth and not args.tls_ca:
        raise UsageError("--supernode-auth needs --tls-ca: Flower authenticates SuperNodes "
                         "only over TLS")
    if not (args.host_samples_per_s >= 0 and args.host_samples_per_s < float("inf")):
        raise UsageError("--host-samples-per-s must be a finite number >= 0 (0: measure)")
    import re

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", args.cgroup_prefix):
        raise UsageError("--cgroup-prefix: 1-40 letters, digits, '_', '.' or '-'")
    check_own_data_flags(args)
    from fedcure_app.data.names import default_name
    name = args.name or default_name(args.data, args.partition_id)
    from fedcure_app.config import WarmClientConfig

    warm = WarmClientConfig.from_env(dict(os.environ), runtime=args.runtime,
                                     device=args.device, gpufreq=args.gpufreq)
    args.device_in_use = device_in_use(warm.device)
    from fedcure_app.runtime.workdir import make_work_dir

    # main() removes a temporary work folder (and the secret) once the children are stopped
    work, args.temp_work = make_work_dir(args.work_dir, "fedcure-client-")
    args.work_path = work
    if warm.runtime == "warm":
        from client.executor import write_secret

        work.chmod(0o700)  # the executor's secret lives here
        args.secret_file = write_secret(work / "superexec.secret")
    channel = open_channel(args.cloud, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                           tls_key=args.tls_key, insecure=args.insecure)
    supernode: Child | None = None
    executor: Child | None = None
    reg: Any = None
    try:
        # a TLS mismatch is said within seconds, not after --connect-timeout
        check_security(channel, args.cloud, insecure=args.insecure, tls_ca=args.tls_ca)
        assoc = pb_grpc.AssociationStub(channel)
        reply = claim(assoc, args, name, stop)
        if reply is None:
            return 0
        try:
            cfg = config_of(reply, args)
        except ValueError as err:  # a mismatch with the cloud (or its task): it need not wait
            withdraw(assoc, args, name, err)
            raise
        index = int(reply.partition_id)
        for stale in (work / "node-data.npz.applied.jsonl", work / RUNTIME_ADDRESS_FILE,
                      work / SUPERNODE_ARGV_FILE):
            stale.unlink(missing_ok=True)
        try:
            # in a child process: the dataset and NumPy never enter this long-lived one
            data = prepare_data(cfg, args, index, name, work / "node-data.npz", stop)
        except (ClientError, DataRefused, ValueError) as err:
            # the cloud logs why and no longer waits for this client
            withdraw(assoc, args, name, err)
            if isinstance(err, DataRefused):
                raise UsageError(f"--data: {err}") from None
            raise
        if data is None:  # asked to stop meanwhile
            return 0
        data_file, home = data.data_file, data.home
        log.info("client %r holds partition %d of %d (%s, label counts %s, initial edge %d, "
                 "device %s)", name, index, reply.num_partitions, holding_text(cfg, data.samples),
                 counts_text(data.label_counts, run_classes(cfg)), home, data.profile.name)
        args.gpufreq_in_use = gpufreq_in_use(warm.gpufreq, data.profile.name)
        log.info("client %r trains on %s (--device %s%s)", name, args.device_in_use,
                 warm.device, f", GPU clock: {args.gpufreq_in_use}"
                 if args.device_in_use == "cuda" else "")
        args.samples_per_s = 0.0
        if args.device_in_use == "cuda" and cfg.task is None:  # the prior: the GPU's rate
            try:
                args.samples_per_s = float(measure_rate(cfg.data.dataset, "cuda",
                                                        cfg.method.batch_size)["samples_per_s"])
                log.info("client %r: %.0f samples/s on cuda (%s, batch %d), sent with Register",
                         name, args.samples_per_s, cfg.data.dataset, cfg.method.batch_size)
            except RuntimeError as err:
                log.warning("%s; the cloud's latency prior stays the device profile's", err)
        env = flower_env(work / "flwr-home", {**warm.to_env(),
                                                "FEDCURE_DEVICE": args.device_in_use})
        if warm.runtime == "warm":
            from client.wake import WAKE_ENV, make_fifo

            from fedcure_app.flower.fastpath.gate import fast_path_on
            # the SuperNode wakes the executor (only a patched one: else the executor polls)
            fifo = make_fifo(work / "wake.fifo") if fast_path_on() else None
            if fifo is not None:
                env[WAKE_ENV] = str(fifo)
            # its trainer loads torch, the model and the data, and the SuperNode imports
            # Flower, while the cloud forms coalitions: none of that lands in the first task
            executor = start_executor(work, None, env, data_file)
            if not args.supernode_auth:  # under auth a refused SuperNode is started again
                supernode = prestart_supernode(work, env)
        public_key = ""
        if args.supernode_auth:
            from fedcure_app.flower.supernode_auth import make_supernode_keys

            args.supernode_key_file, public = make_supernode_keys(work / "supernode-keys")
            public_key = public.read_text().strip()
        try:
            reg = register(assoc, args, name, data, home, stop, public_key)
        except ClientError as err:
            if "FAILED_PRECONDITION" in str(err) and "model differs" in str(err):
                raise UsageError(str(err)) from None  # refused for its model: a user's fix
            raise
        if reg is None:
            return 0
        log.info("client %r is client %d of edge %d (edge address %s; %d clients, %d edges)",
                 name, reg.client_id, reg.edge_id, printable(reg.edge_address), reg.num_clients,
                 reg.num_edges)
        (work / "registration.json").write_text(json.dumps({
            "name": name, "partition_id": index, "client_id": reg.client_id,
            "edge_id": reg.edge_id, "edge_address": reg.edge_address, "home_edge": home,
            "label_counts": data.label_counts, "device": args.device_in_use,
            "gpufreq": args.gpufreq_in_use if args.device_in_use == "cuda" else "off",
            "samples_per_s": args.samples_per_s or None}))
        port = free_port()
        if executor is not None:
            publish_runtime_port(work, port)
        argv = supernode_argv(reg.edge_address, port, reg.client_id, args.cpufreq, data_file,
                              args)
        if supernode is not None:
            release_supernode(work, argv)
        else:
            supernode = start_supernode(argv, work, env, stop, args.supernode_auth)
        log.info("client %d: SuperNode (pid %d, runtime port %d, runtime %s) -> %s",
                 reg.client_id, supernode.pid, port, warm.runtime, reg.edge_address)
        restarts = quick_exits = 0
        started_at = time.monotonic()
        monitor = pb_grpc.MonitorStub(channel)
        lost_since: float | None = None
        asked_at = -float("inf")
        import grpc

        while not stop.is_set():
            if supernode.poll() is not None:
                quick_exits = quick_exits + 1 if time.monotonic() - started_at < QUICK_EXIT_S else 1
                if quick_exits > SUPERNODE_RESTARTS:
                    raise ClientError(f"flower-supernode exited with code "
                                      f"{supernode.proc.returncode} {quick_exits} times in a row;"
                                      f" its log ends with:\n{supernode.tail()}")
                taken = runtime_port_taken(supernode.tail(40) or "")
                supernode.stop(grace_s=1.0)
                if taken:  # another process bound the picked port first: pick another
                    port = free_port()
                    argv = supernode_argv(reg.edge_address, port, reg.client_id, args.cpufreq,
                                          data_file, args)
                    log.warning("client %d: the SuperNode's Runtime API port was taken by "
                                "another process; starting it again on port %d",
                                reg.client_id, port)
                    if executor is not None:
                        publish_runtime_port(work, port)
                        executor.stop(grace_s=1.0)
                        executor = start_executor(work, port, env, data_file)
                else:
                    log.warning("client %d: flower-supernode exited with code %d (its edge "
                                "server restarted?); starting it again", reg.client_id,
                                supernode.proc.returncode)
                    stop.wait(1.0)
                supernode = start_supernode(argv, work, env, stop, args.supernode_auth)
                started_at = time.monotonic()
                continue
            if executor is not None and executor.poll() is not None:
                restarts += 1
                if restarts > warm.trainer_restarts:
                    raise ClientError(f"the executor exited {restarts} times (last code "
                                      f"{executor.proc.returncode}); its log ends with:\n"
                                      f"{executor.tail()}")
                log.warning("client %d: the executor exited with code %d; starting it again",
                            reg.client_id, executor.proc.returncode)
                executor.stop(grace_s=1.0)
                executor = start_executor(work, port, env, data_file)
            if time.monotonic() - asked_at < STATUS_EVERY_S:
                stop.wait(WATCH_EVERY_S)
                continue
            asked_at = time.monotonic()
            try:
                status = monitor.Status(pb.StatusRequest(), timeout=5.0)
                lost_since = None
                if status.phase == pb.StatusReply.DONE:
                    applied = read_applied(data_file)
                    log.info("client %d: training over; trained %d times, directives applied "
                             "(GHz): %s", reg.client_id, len(applied),
                             [round(a["applied_ghz"], 3) for a in applied])
                    return 0
            except grpc.RpcError as err:
                now = time.monotonic()
                lost_since = lost_since or now
                if now - lost_since > args.cloud_lost_timeout:
                    raise ClientError(f"lost the cloud at {args.cloud} for "
                                      f"{args.cloud_lost_timeout:.0f} s ({err.code().name})"
                                      ) from None
            stop.wait(WATCH_EVERY_S)
        log.info("stopping on request")
        return 0
    finally:
        # asked to stop (SIGTERM: compose allows 10 s in all), or the run is over (nothing waits
        # for this client, and a loaded machine may need longer to shut Flower's SuperNode down)
        stop_children([c for c in (executor, supernode) if c is not None],
                      CHILD_STOP_GRACE_S if stop.is_set() else RUN_END_GRACE_S)
        if args.cpufreq == "cgroup" and reg is not None:
            # a trainer stopped by a signal leaves its (now empty) cgroup behind
            from fedcure_app.devices.cgroup import remove_cgroups

            remove_cgroups(f"{args.cgroup_prefix}-client{reg.client_id}-")
        channel.close()



def check_own_data_flags(args: argparse.Namespace) -> None:
    """One line (:class:`UsageError`) for own-data flags that cannot work, before anything
    starts."""
    if args.data is None:
        for flag in ("label_column", "holdout"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')}: only with --data")
        if args.histogram_epsilon is not None or args.histogram_min_count is not None:
            raise UsageError("--histogram-epsilon/--histogram-min-count: only with --data")
        return
    if args.dataset or args.data_dir or args.num_partitions is not None:
        raise UsageError("--data: the client reads only its own data (leave out --dataset, "
                         "--data-dir and --num-partitions)")
    if not Path(args.data).exists():
        raise UsageError(f"--data {args.data}: no such file or folder")
    if args.holdout is not None and not 0.0 <= args.holdout < 1.0:
        raise UsageError(f"--holdout {args.holdout}: must be in [0, 1)")
    eps = args.histogram_epsilon
    from fedcure_app.config import MIN_HISTOGRAM_EPSILON
    if eps is not None and not (eps == 0 or MIN_HISTOGRAM_EPSILON <= eps < float("inf")):
        raise UsageError(f"--histogram-epsilon must be 0 (exact counts) or a finite number >= "
                         f"{MIN_HISTOGRAM_EPSILON:g}")
    if args.histogram_min_count is not None and args.histogram_min_count < 0:
        raise UsageError("--histogram-min-count must be >= 0")


def prepare_data(cfg: Any, args: argparse.Namespace, index: int, name: str, out: Path,
                 stop: threading.Event) -> Any:
    """The node data file and the facts to register with: the device's own data under the
    cloud's task (``--data``), else partition ``index`` of the cloud's dataset."""
    if cfg.task is None:
        return cut_partition(cfg, index, name, out, stop=stop)
    return read_own_data(cfg, index, name, out, data=args.data, label_column=args.label_column,
                         holdout=args.holdout,
                         epsilon=cfg.data.histogram_epsilon if args.histogram_epsilon is None
                         else args.histogram_epsilon,
                         min_count=cfg.data.histogram_min_count
                         if args.histogram_min_count is None else args.histogram_min_count,
                         stop=stop)


def main(argv: list[str] | None = None) -> int:
    from fedcure_app.runtime.processes import quiet_grpc, role_start

    quiet_grpc()
    args = build_parser().parse_args(argv)
    if args.probe:
        try:
            return probe(args.cpufreq_root, args.dataset, args.device)
        except (UsageError, RuntimeError, KeyError) as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2 if isinstance(err, UsageError) else 1
    stop = role_start(args.quiet, log)
    from fedcure_app.flower.fastpath.gate import warn_if_off
    warn_if_off(PROG)  # one line on stderr when Flower runs unchanged (no fast path)
    from fedcure_app.config import ConfigError
    from fedcure_app.protocol.channel import ChannelConfigError
    from fedcure_app.runtime.workdir import drop_work_dir

    try:
        return run_client(args, stop)
    except (UsageError, ConfigError, ChannelConfigError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except (ClientError, OSError, ValueError) as err:  # a DatasetError is a ValueError
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    finally:  # run_client stopped its children: nothing writes there any more
        drop_work_dir(getattr(args, "work_path", None), getattr(args, "temp_work", False),
                      secrets=[getattr(args, "secret_file", None)])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = [
    "CHILD_STOP_GRACE_S", "PROG", "RUNTIME_ADDRESS_FILE", "RUN_END_GRACE_S", "STATUS_EVERY_S",
    "SUPERNODE_ARGV_FILE", "ClientError", "build_node_data", "build_parser", "call", "claim",
    "config_of", "device_in_use", "gpufreq_in_use", "main", "measure_rate", "prestart_supernode",
    "probe", "publish_runtime_port", "register", "release_supernode", "run_client",
    "start_executor", "start_supernode", "stop_children", "supernode_argv",
]
