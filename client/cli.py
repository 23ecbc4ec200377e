"""``fedcure-client``: one client device of a FedCure deployment.

    fedcure-client --cloud HOST:PORT [--name NAME] [--dataset D] [--data-dir DIR] \\
        [--partition-id I --num-partitions N] [--cpufreq sysfs|emulate|cgroup|off] [--token T] \\
        [--cpufreq-root DIR] [--host-samples-per-s R] [--cgroup-prefix P] [--insecure] [--tls-ca FILE] [--work-dir DIR]
    fedcure-client --probe [--cpufreq-root DIR]

1. Claims its partition (``Association.Claim``, keyed by ``--name``, default
   ``<hostname>-<pid>``; ``--partition-id`` asks for a given one) and gets the cloud's
   configuration, from which it computes exactly the partition ``fedcure simulate`` would
   (:func:`fedcure_app.federation.partition_for`), its label counts, its initial ES and its
   simulated device profile.
2. Registers (``Association.Register``; it answers once coalition formation has run and the
   chosen ES is up) and learns its client id and its ES's address.
3. Writes its data file (:mod:`fedcure_app.flower.node_data`) and starts ``flower-supernode`` to that
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
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fedcure_app.errors import UsageError

PROG = "fedcure-client"
log = logging.getLogger("fedcure.client")


def build_parser() -> argparse.ArgumentParser:
    from fedcure_app.errors import ArgumentParser, HelpFormatter

    p = ArgumentParser(prog=PROG, description="FedCure client: register with the "
                                "cloud, then run a Flower SuperNode to the assigned edge server.",
                                formatter_class=HelpFormatter)
    p.add_argument("--cloud", metavar="HOST:PORT",
                   help="the cloud's address (required unless --probe)")
    p.add_argument("--name", help="stable client name (default <hostname>-<pid>)")
    p.add_argument("--dataset", help="dataset the client holds; must match the cloud's "
                   "(default: the cloud's)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="root holding the dataset files (default: $FEDCURE_DATA_DIR, else ./data)")
    p.add_argument("--partition-id", type=int, metavar="I",
                   help="ask for partition I (default: the cloud assigns one)")
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
                   help="print this device's profile (JSON) and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p


class ClientError(RuntimeError):
    """The client cannot go on (one line)."""


def _rpc_error(err: Any, address: str, what: str) -> ClientError:
    import grpc

    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ClientError(f"cannot reach the cloud at {address} ({what}: {err.details()}); "
                           "wrong address, or the cloud is not running")
    return ClientError(f"the cloud refused {what} ({code.name}: {err.details()})")


def call(method: Any, request: Any, timeout_s: float, stop: threading.Event) -> Any:
    """A unary call that gives up (returns None) as soon as ``stop`` is set."""
    fut = method.future(request, timeout=timeout_s, wait_for_ready=True)
    while not fut.done():
        if stop.wait(0.1):
            fut.cancel()
            return None
    return fut.result()


def claim(stub: Any, args: argparse.Namespace, name: str, stop: threading.Event) -> Any:
    """``Association.Claim`` (waits up to --connect-timeout for the cloud to come up)."""
    import grpc

    from fedcure_app.protocol import cloud_pb2 as pb

    req = pb.ClaimRequest(client_name=name, token=args.token)
    if args.partition_id is not None:
        req.partition_id = args.partition_id
    try:
        return call(stub.Claim, req, args.connect_timeout, stop)
    except grpc.RpcError as err:
        raise _rpc_error(err, args.cloud, "Claim") from None


def config_of(reply: Any, args: argparse.Namespace) -> Any:
    """The cloud's configuration, with this client's --data-dir; --dataset must agree."""
    from fedcure_app.config import apply_flat, build_config

    cfg = build_config(json.loads(reply.config_json))
    if args.dataset and args.dataset.lower() != cfg.data.dataset:
        raise UsageError(f"--dataset {args.dataset} differs from the cloud's dataset "
                         f"{cfg.data.dataset}")
    if args.num_partitions is not None and args.num_partitions != reply.num_partitions:
        raise UsageError(f"--num-partitions {args.num_partitions} differs from the cloud's "
                         f"{reply.num_partitions} clients")
    if args.data_dir is not None:
        cfg = apply_flat(cfg, {"data-dir": args.data_dir})
    return cfg


def build_node_data(cfg: Any, index: int, name: str) -> Any:
    """This client's samples, label counts, initial ES and device profile (as simulate has)."""
    from fedcure_app.federation import partition_for, profiles_for
    from fedcure_app.data import load_dataset
    from fedcure_app.flower.node_data import NodeData

    ds = load_dataset(cfg.data.dataset, cfg.data.data_dir)
    part = partition_for(cfg, ds)
    idx = part.client_indices[index]
    if len(idx) == 0:
        raise ClientError(f"partition {index} of {cfg.data.dataset} is empty: nothing to train")
    data = NodeData(x=ds.x_train[idx], y=ds.y_train[idx], dataset=ds.name,
                    num_classes=ds.num_classes, client_name=name, partition_id=index,
                    profile=profiles_for(cfg)[index])
    return data, int(part.initial_assignment[index])


def register(stub: Any, args: argparse.Namespace, name: str, data: Any, home: int,
             stop: threading.Event, supernode_key: str = "") -> Any:
    """``Association.Register`` until formation has run (re-calling on DEADLINE_EXCEEDED)."""
    import grpc

    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol.codec import profile_to_proto

    req = pb.RegisterRequest(client_name=name, label_counts=data.label_counts.tolist(),
                             device=profile_to_proto(data.profile), home_edge=home,
                             token=args.token, supernode_public_key=supernode_key)
    end = time.monotonic() + args.register_timeout
    while not stop.is_set():
        left = end - time.monotonic()
        if left <= 0:
            raise ClientError(f"coalition formation did not run within {args.register_timeout:.0f}"
                              " s (not all expected clients registered?)")
        try:
            return call(stub.Register, req, min(left, 120.0), stop)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                log.info("still waiting for coalition formation: %s", err.details())
                continue
            raise _rpc_error(err, args.cloud, "Register") from None
    return None


def supernode_argv(edge_address: str, port: int, client_id: int, cpufreq: str,
                   data_file: Path, args: argparse.Namespace) -> list[str]:
    """``flower-supernode`` to ``edge_address`` with this client's node config."""
    from fedcure_app.flower.tools import flower_bin

    node_config = f'client-id={client_id} cpufreq="{cpufreq}" data-file="{data_file}"'
    if getattr(args, "cpufreq_root", None):
        node_config += f' cpufreq-root="{Path(args.cpufreq_root).resolve()}"'
    if cpufreq == "cgroup":
        node_config += (f' host-samples-per-s={float(getattr(args, "host_samples_per_s", 0.0))}'
                        f' cgroup-prefix="{getattr(args, "cgroup_prefix", "fedcure")}"')
    device = getattr(args, "device_in_use", "cpu")
    if device != "cpu":
        node_config += f' device="{device}" gpufreq="{getattr(args, "gpufreq_in_use", "off")}"'
        if getattr(args, "gpufreq_root", None):
            node_config += f' gpufreq-root="{Path(args.gpufreq_root).resolve()}"'
    if getattr(args, "runtime", "flower") == "warm":
        argv = [sys.executable, "-m", "client.supernode", "--superlink", edge_address,
                "--port", str(port), "--node-config", node_config, "--isolation", "process",
                "--superexec-auth-secret-file", str(args.secret_file)]
    else:
        argv = [flower_bin("flower-supernode"), "--superlink", edge_address,
                "--port", str(port), "--node-config", node_config]
    if args.insecure:
        argv.append("--insecure")
    elif args.tls_ca:
        argv += ["--root-certificates", str(Path(args.tls_ca).resolve())]
    if getattr(args, "supernode_key_file", None):
        argv += ["--auth-supernode-private-key", str(args.supernode_key_file)]
    return argv


def start_supernode(argv: list[str], work: Path, env: dict[str, str], stop: threading.Event,
                    auth: bool, wait_s: float = 120.0) -> Any:
    """Start ``flower-supernode``. Under SuperNode authentication the edge registers this
    client's key a moment after Register answers; a SuperNode that started before that exits
    (Flower's code 305) and is started again (for at most ``wait_s``)."""
    from fedcure_app.runtime.processes import Child
    from fedcure_app.flower.supernode_auth import refused

    end = time.monotonic() + wait_s
    while True:
        child = Child("flower-supernode", argv, log_path=work / "supernode.log", env=env,
                      cwd=work)
        if not auth:
            return child
        # a refused SuperNode exits within a few seconds of its first connection attempt
        settle = time.monotonic() + 15.0
        while time.monotonic() < settle and child.poll() is None and not stop.is_set():
            if "SuperNode ID" in (child.tail(40) or ""):
                return child
            time.sleep(0.2)
        code = child.poll()
        if code is None or stop.is_set():
            return child
        if not refused(child.tail(60) or "") or time.monotonic() > end:
            return child  # the caller reports the exit
        child.stop(grace_s=1.0)  # and the SuperExec it started
        (work / "supernode.log").rename(work / "supernode-refused.log")
        log.info("the edge has not registered this SuperNode's key yet; starting it again")
        stop.wait(1.0)


#: seconds between the client's asks whether training is over (``Monitor.Status``): each ask
#: costs the client and the cloud CPU that an edge round on the same host would use
STATUS_EVERY_S = 2.0
#: where ``fedcure-client`` writes the SuperNode's Runtime API address for an executor started
#: before the SuperNode (in its work directory)
RUNTIME_ADDRESS_FILE = "runtime-api-address"
#: where it writes the arguments of a SuperNode started before registration (work directory)
SUPERNODE_ARGV_FILE = "supernode-argv.json"


def prestart_supernode(work: Path, env: dict[str, str]) -> Any:
    """A :mod:`client.supernode` that imports Flower now and waits for its arguments
    (:func:`release_supernode`), so Flower's import does not land in the first task."""
    from fedcure_app.runtime.processes import Child

    argv = [sys.executable, "-m", "client.supernode", "--argv-file",
            str(work / SUPERNODE_ARGV_FILE)]
    return Child("flower-supernode", argv, log_path=work / "supernode.log", env=env, cwd=work)


def release_supernode(work: Path, argv: list[str]) -> None:
    """Hand a prestarted SuperNode its arguments: ``argv`` as :func:`supernode_argv` gives it
    (``python -m client.supernode ARGS``), written atomically."""
    tmp = work / (SUPERNODE_ARGV_FILE + ".tmp")
    tmp.write_text(json.dumps(argv[3:]))
    tmp.replace(work / SUPERNODE_ARGV_FILE)


def start_executor(work: Path, port: int | None, env: dict[str, str],
                   data_file: Path | None = None) -> Any:
    """The warm executor (:mod:`client.executor`) for the SuperNode's Runtime API on ``port``
    (log in ``work/executor.log``); its trainer loads ``data_file`` before the first message.
    ``port`` None: the SuperNode does not exist yet; the executor reads its address from
    ``work/runtime-api-address`` once :func:`publish_runtime_port` has written it."""
    from fedcure_app.runtime.processes import Child

    where = (["--runtime-api-address", f"127.0.0.1:{port}"] if port is not None
             else ["--runtime-api-address-file", str(work / RUNTIME_ADDRESS_FILE)])
    argv = [sys.executable, "-m", "client.executor", *where,
            "--secret-file", str(work / "superexec.secret"), "--parent-pid", str(os.getpid())]
    if data_file is not None:
        argv += ["--data-file", str(data_file)]
    return Child("client.executor", argv, log_path=work / "executor.log", env=env, cwd=work)


def publish_runtime_port(work: Path, port: int) -> None:
    """Tell an executor started before the SuperNode where its Runtime API is (atomically)."""
    tmp = work / (RUNTIME_ADDRESS_FILE + ".tmp")
    tmp.write_text(f"127.0.0.1:{port}\n")
    tmp.replace(work / RUNTIME_ADDRESS_FILE)


#: exit code of the CUDA check's child when torch sees no GPU
_NO_CUDA = 3


def device_in_use(device: str) -> str:
    """``cpu`` or ``cuda`` for ``--device`` (``auto``: cuda when torch sees a GPU). The check
    runs torch in a short-lived child, so this role process never loads torch (~150 MB);
    ``cuda`` without a GPU raises :class:`UsageError` (one line)."""
    if device == "cpu":
        return "cpu"
    import subprocess

    probe = ("import sys, torch\n"
             "ok = torch.cuda.is_available()\n"
             "print('no GPU visible' if torch.version.cuda else 'a CPU-only torch build', "
             "torch.__version__)\n"
             f"sys.exit(0 if ok else {_NO_CUDA})\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300)
    if res.returncode == 0:
        return "cuda"
    if device == "auto":
        return "cpu"
    why = (res.stdout.strip() or res.stderr.strip().splitlines()[-1:] or ["torch failed"])
    why = why if isinstance(why, str) else why[0]
    raise UsageError(f"--device cuda: CUDA is not available ({why}); use --device cpu or auto")


def gpufreq_in_use(gpufreq: str, profile_name: str) -> str:
    """``devfreq`` or ``off`` for ``--gpufreq`` (``preset``: devfreq on a Jetson profile)."""
    if gpufreq == "preset":
        return "devfreq" if profile_name.lower().startswith("jetson") else "off"
    return gpufreq


def run_client(args: argparse.Namespace, stop: threading.Event) -> int:
    from fedcure_app.flower.node_data import read_applied, save_node_data
    from fedcure_app.runtime.processes import Child, flower_env, free_port, split_address
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.channel import open_channel

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
    name = args.name or f"{socket.gethostname()}-{os.getpid()}"
    from fedcure_app.config import WarmClientConfig

    warm = WarmClientConfig.from_env(dict(os.environ), runtime=args.runtime,
                                     device=args.device, gpufreq=args.gpufreq)
    args.device_in_use = device_in_use(warm.device)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fedcure-client-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
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
        assoc = pb_grpc.AssociationStub(channel)
        reply = claim(assoc, args, name, stop)
        if reply is None:
            return 0
        cfg = config_of(reply, args)
        index = int(reply.partition_id)
        data, home = build_node_data(cfg, index, name)
        log.info("client %r holds partition %d of %d (%s, %d samples, label counts %s, "
                 "initial edge %d, device %s)", name, index, reply.num_partitions,
                 cfg.data.dataset, len(data.y), data.label_counts.tolist(), home,
                 data.profile.name)
        args.gpufreq_in_use = gpufreq_in_use(warm.gpufreq, data.profile.name)
        log.info("client %r trains on %s (--device %s%s)", name, args.device_in_use,
                 warm.device, f", GPU clock: {args.gpufreq_in_use}"
                 if args.device_in_use == "cuda" else "")
        data_file = save_node_data(work / "node-data.npz", data)
        from fedcure_app.runtime.processes import release_memory

        release_memory()  # the dataset this client's partition was cut from is gone
        for stale in (work / "node-data.npz.applied.jsonl", work / RUNTIME_ADDRESS_FILE,
                      work / SUPERNODE_ARGV_FILE):
            stale.unlink(missing_ok=True)
        env = flower_env(work / "flwr-home", {**warm.to_env(),
                                                "FEDCURE_DEVICE": args.device_in_use})
        if warm.runtime == "warm":
            from client.wake import WAKE_ENV, make_fifo

            fifo = make_fifo(work / "wake.fifo")  # the SuperNode wakes the executor
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
        reg = register(assoc, args, name, data, home, stop, public_key)
        if reg is None:
            return 0
        log.info("client %r is client %d of edge %d (edge address %s; %d clients, %d edges)",
                 name, reg.client_id, reg.edge_id, reg.edge_address, reg.num_clients,
                 reg.num_edges)
        (work / "registration.json").write_text(json.dumps({
            "name": name, "partition_id": index, "client_id": reg.client_id,
            "edge_id": reg.edge_id, "edge_address": reg.edge_address, "home_edge": home,
            "label_counts": data.label_counts.tolist(), "device": args.device_in_use,
            "gpufreq": args.gpufreq_in_use if args.device_in_use == "cuda" else "off"}))
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
        restarts = 0
        monitor = pb_grpc.MonitorStub(channel)
        lost_since: float | None = None
        asked_at = -float("inf")
        import grpc

        while not stop.is_set():
            if supernode.poll() is not None:
                raise ClientError(f"flower-supernode exited with code {supernode.proc.returncode};"
                                  f" its log ends with:\n{supernode.tail()}")
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
                stop.wait(0.5)
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
            stop.wait(0.5)
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


#: how long the executor and the SuperNode may take to exit on SIGTERM (s); both are stopped at
#: once, so a client stops within compose's 10 s grace. The executor takes well under a second
#: (client.executor.stoppable_retries); the SuperNode's HTTP server shuts down gracefully, which
#: took over 3 s on a loaded 2-core machine.
CHILD_STOP_GRACE_S = 8.0
#: the same once the run is over and the client ends on its own (s): the SuperNode's graceful
#: exit has taken over 8 s on a machine with a load average of 25 (its own force-exit timer is
#: 5 s, started only once its exit handlers run); fedcure launch waits 60 s for clients to end
RUN_END_GRACE_S = 30.0


def stop_children(children: list[Any], grace_s: float = CHILD_STOP_GRACE_S) -> None:
    """SIGTERM ``children`` together and wait for all of them (each killed after ``grace_s``)."""
    threads = [threading.Thread(target=c.stop, kwargs={"grace_s": grace_s}) for c in children]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def probe(cpu_root: str | None = None) -> int:
    from fedcure_app.devices import DEFAULT_CPU_ROOT, probe_device

    print(json.dumps(probe_device(cpu_root or DEFAULT_CPU_ROOT), indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    from fedcure_app.runtime.processes import quiet_grpc, role_start

    quiet_grpc()
    args = build_parser().parse_args(argv)
    if args.probe:
        return probe(args.cpufreq_root)
    stop = role_start(args.quiet, log)
    from fedcure_app.config import ConfigError
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.protocol.channel import ChannelConfigError

    try:
        return run_client(args, stop)
    except (UsageError, ConfigError, ChannelConfigError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except (ClientError, DatasetError, OSError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
