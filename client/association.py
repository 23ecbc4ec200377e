"""The client's calls to the cloud's ``Association`` service: claim a partition, cut it from
the dataset, register (``fedcure-client``, :mod:`client.cli`)."""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from typing import Any

from fedcure_app.errors import UsageError
from fedcure_app.protocol.text import printable

log = logging.getLogger("fedcure.client")


class ClientError(RuntimeError):
    """The client cannot go on (one line)."""


def _rpc_error(err: Any, address: str, what: str,
               args: argparse.Namespace | None = None) -> Exception:
    """One line for a failed call; a TLS mismatch (probed when ``args`` is given) is a
    ``ChannelSecurityError`` naming the option that fixes it."""
    import grpc

    from fedcure_app.protocol.channel import ChannelSecurityError, security_mismatch

    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        why = args is not None and security_mismatch(address, insecure=args.insecure,
                                                     tls_ca=args.tls_ca)
        if why:
            return ChannelSecurityError(why)
        return ClientError(f"cannot reach the cloud at {address} ({what}: "
                           f"{printable(err.details())}); "
                           "wrong address, or the cloud is not running")
    return ClientError(f"the cloud refused {what} ({code.name}: {printable(err.details())})")


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
        raise _rpc_error(err, args.cloud, "Claim", args) from None


#: how long a refused client keeps trying to tell the cloud it withdraws (seconds): the call
#: waits for the channel to be ready, so a cloud slowed by a start-up burst still hears it
#: (else it waits for the client until its registration window closes)
WITHDRAW_TIMEOUT_S = 30.0


def withdraw(stub: Any, args: argparse.Namespace, name: str, refusal: BaseException) -> None:
    """``Association.Withdraw`` (best effort, up to :data:`WITHDRAW_TIMEOUT_S`): the cloud logs
    why this client cannot take part, as a code and a count only
    (:func:`fedcure_app.protocol.withdraw.withdraw_reason`; the refusal's line, which may name
    files, stays here), and stops waiting for it. Withdrawing twice is the same as once."""
    import grpc

    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol.withdraw import withdraw_reason

    reason = withdraw_reason(refusal)
    try:
        stub.Withdraw(pb.WithdrawRequest(client_name=name, reason=reason, token=args.token),
                      timeout=WITHDRAW_TIMEOUT_S, wait_for_ready=True)
        log.info("told the cloud this client withdraws (%s)", reason)
    except grpc.RpcError as err:
        log.warning("could not tell the cloud this client withdraws (%s)", err.code().name)


def config_of(reply: Any, args: argparse.Namespace) -> Any:
    """The cloud's configuration, with this client's --data-dir; --dataset must agree, and
    --data goes with a cloud that runs a task."""
    from fedcure_app.config import apply_flat, build_config

    cfg = build_config(json.loads(reply.config_json))
    own = getattr(args, "data", None)
    if cfg.task is not None:
        check_task_consent(cfg.task.model, args)
        if not own:
            raise UsageError("the cloud runs a task on the clients' own data: give --data "
                             "PATH (this device's data)")
        if args.dataset:
            raise UsageError(f"--dataset {args.dataset}: the cloud runs a task on the "
                             "clients' own data (--data)")
        return cfg
    if own:
        raise UsageError(f"--data {own}: the cloud runs the built-in dataset "
                         f"{cfg.data.dataset}; own data needs a cloud started with --task")
    if args.dataset and args.dataset.lower() != cfg.data.dataset:
        raise UsageError(f"--dataset {args.dataset} differs from the cloud's dataset "
                         f"{cfg.data.dataset}")
    if args.num_partitions is not None and args.num_partitions != reply.num_partitions:
        raise UsageError(f"--num-partitions {args.num_partitions} differs from the cloud's "
                         f"{reply.num_partitions} clients")
    if args.data_dir is not None:
        from fedcure_app.data.loader import unused_data_dir

        if note := unused_data_dir(cfg.data.dataset, args.data_dir):
            log.warning("%s", note)
        cfg = apply_flat(cfg, {"data-dir": args.data_dir})
    return cfg


def check_task_consent(model: str, args: argparse.Namespace) -> None:
    """The cloud's task may name ``model``: built in, or an import path this client's owner
    allowed (``--allow-model``, or the model of its own ``--task`` file); else
    :class:`fedcure_app.data.model_consent.ModelNotAllowed` in one line."""
    from fedcure_app.data.model_consent import check_consent, parse_allowed

    allowed = parse_allowed(getattr(args, "allow_model", None))
    own_task = getattr(args, "task", None)
    if own_task:
        from fedcure_app.data.task import load_task

        allowed |= {load_task(own_task).model}
    check_consent(model, allowed)


def build_node_data(cfg: Any, index: int, name: str) -> Any:
    """This client's samples, label counts, initial ES and device profile (as simulate has).
    The images stay uint8 pixels as the dataset stores them (a quarter of float32's bytes); the
    trainer normalises each batch (:class:`fedcure_app.training.PixelNorm`)."""
    from types import SimpleNamespace

    import numpy as np

    from fedcure_app.data.dataset import norm_constants
    from fedcure_app.data.loader import load_raw
    from fedcure_app.data.specs import SPECS, canonical_name
    from fedcure_app.federation import partition_for, profiles_for
    from fedcure_app.flower.node_data import NodeData

    spec = SPECS[canonical_name(cfg.data.dataset)]
    raw, _source, _cached = load_raw(spec.name, cfg.data.data_dir)
    y = np.ascontiguousarray(raw.y_train, dtype=np.int64)
    part = partition_for(cfg, SimpleNamespace(y_train=y, num_classes=spec.num_classes))
    idx = part.client_indices[index]
    if len(idx) == 0:
        raise ClientError(f"partition {index} of {cfg.data.dataset} is empty: nothing to train")
    data = NodeData(x=raw.x_train[idx], y=y[idx], dataset=spec.name,
                    num_classes=spec.num_classes, client_name=name, partition_id=index,
                    profile=profiles_for(cfg)[index],
                    pixel_norm=tuple(tuple(float(v) for v in a)  # type: ignore[arg-type]
                                     for a in norm_constants(spec)))
    return data, int(part.initial_assignment[index])


def register(stub: Any, args: argparse.Namespace, name: str, data: Any, home: int,
             stop: threading.Event, supernode_key: str = "") -> Any:
    """``Association.Register`` until formation has run (re-calling on DEADLINE_EXCEEDED, and
    on UNAVAILABLE: the cloud restarting), within ``--register-timeout``."""
    import grpc

    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol.profiles import profile_to_proto

    req = pb.RegisterRequest(client_name=name, label_counts=[int(c) for c in data.label_counts],
                             device=profile_to_proto(data.profile), home_edge=home,
                             token=args.token, supernode_public_key=supernode_key,
                             compute_device=getattr(args, "device_in_use", "cpu"),
                             samples_per_s=float(getattr(args, "samples_per_s", 0.0) or 0.0),
                             num_samples=int(getattr(data, "samples", 0)
                                             or sum(int(c) for c in data.label_counts)),
                             model_signature=getattr(data, "model_signature", ""),
                             histogram_epsilon=float(getattr(data, "histogram_epsilon", 0.0)),
                             histogram_min_count=int(getattr(data, "histogram_min_count", 0)))
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
                log.info("still waiting for coalition formation: %s", printable(err.details()))
                continue
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                # the cloud answered Claim, so it exists: it went away (a restart) while this
                # client waited; the next call waits for it to come back, within the timeout
                log.warning("the cloud went away while this client registered (%s); "
                            "registering again", printable(err.details()))
                stop.wait(1.0)
                continue
            raise _rpc_error(err, args.cloud, "Register", args) from None
    return None
