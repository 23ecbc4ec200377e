"""``fedcure-cloud``: run the FedCure cloud server (gRPC) until the configured rounds are done.

    fedcure-cloud --listen 0.0.0.0:9090 --expected-clients 50 --edges 5 --out results/cloud \\
        [--config fedcure.toml] [--method fedcure] [--rounds 100] [--register-timeout 300] \\
        [--dataset mnist --data-dir data/mnist] [--token SECRET] \\
        [--dashboard 127.0.0.1:8080 [--dashboard-token SECRET]] \\
        (--tls-cert server.crt --tls-key server.key [--tls-client-ca ca.crt] | --insecure)

Clients register (``Association.Register``) and learn their edge server; edge servers connect
(``EdgeLink.Connect``) and receive tasks, answering with ``EdgeLink.Submit``. When the rounds are
done the cloud writes ``result.json``, the plots and ``final_model.safetensors`` into ``--out``
and exits 0. SIGTERM/SIGINT stop it cleanly (partial results are written when rounds were done;
a run that finished keeps the results it wrote, also when the stop lands as it writes them).
With ``--dataset`` (or ``[data] dataset`` in the config file) the cloud evaluates the global model
on that dataset's test split every ``eval-every`` rounds. ``--dashboard HOST:PORT`` serves the live
view (a page updated by server-sent events) and ``/metrics`` (Prometheus) over HTTP; an address
other than loopback needs ``--dashboard-token`` (``cloud_server.live``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

PROG = "fedcure-cloud"
#: refuse to serve plaintext without --insecure
ENFORCE_TLS = True


def build_parser() -> argparse.ArgumentParser:
    from fedcure_app.errors import ArgumentParser, HelpFormatter

    p = ArgumentParser(prog=PROG, description="FedCure cloud server (gRPC).",
                                formatter_class=HelpFormatter)
    p.add_argument("--config", metavar="FILE", help="TOML/JSON configuration file")
    p.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="address to serve on, e.g. 0.0.0.0:9090 (port 0: any free port)")
    p.add_argument("--expected-clients", type=int, required=True, metavar="N",
                   help="formation runs as soon as N clients have registered")
    p.add_argument("--edges", type=int, required=True, metavar="M",
                   help="edge servers (coalitions)")
    p.add_argument("--out", metavar="DIR", default="results/cloud",
                   help="output folder for result.json, plots, final_model.safetensors")
    p.add_argument("--register-timeout", type=float, default=300.0, metavar="S",
                   help="registration window (s) and the longest one Register call waits "
                        "(default 300)")
    p.add_argument("--rounds", type=int, metavar="N",
                   help="global rounds (default: the --config file's [run] global-rounds, "
                        "else 100)")
    p.add_argument("--method", metavar="NAME",
                   help="method preset: fedcure, fedfair, fedgreedy, fair, greedy "
                        "(default: none, the configuration's formation and scheduler)")
    p.add_argument("--formation", metavar="RULE",
                   help="formation rule: fedcure, none, kmeans, meanshift, selfish, pareto "
                        "(default: the configuration's, else fedcure)")
    p.add_argument("--dataset", metavar="D",
                   help="dataset (model architecture, and test split for evaluation; "
                        "default: the configuration's, else digits)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="root holding the dataset files (default: $FEDCURE_DATA_DIR, else ./data)")
    own = p.add_argument_group("own data (docs/own-data.md)")
    own.add_argument("--task", metavar="FILE",
                     help="task file: the clients train on their own data (fedcure-client "
                          "--data) under this task, which the cloud hands them; the global "
                          "model is evaluated on the clients' held-out parts (federated) "
                          "unless --test-data is given")
    own.add_argument("--test-data", metavar="PATH",
                     help="with --task: a central test set in any format a client reads "
                          "(all of it is test data): evaluate the global model here instead")
    own.add_argument("--label-column", default="label",
                     help="with --task: the label column of CSV data (default label)")
    p.add_argument("--init-model", metavar="FILE",
                   help="start from this model instead of a fresh one: a model.pt, model.pt2 "
                        "or .safetensors of the same task (checked against the task's model)")
    p.add_argument("--no-eval", action="store_true", help="never evaluate the global model")
    p.add_argument("--token", default=os.environ.get("FEDCURE_TOKEN", ""),
                   help="shared secret clients and edges must send (default $FEDCURE_TOKEN)")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument("--resume", action="store_true",
                   help="resume from the checkpoint in --out/checkpoint when there is one")
    p.add_argument("--no-checkpoint", action="store_true",
                   help="write no checkpoints (a crash then loses the run)")
    p.add_argument("--max-client-weight", type=float, default=None, metavar="W",
                   help="the largest share of its coalition's FedAvg weight one client may "
                        "take, whatever count it registered (default: the configuration's, "
                        "else 0.5; 1: plain FedAvg)")
    p.add_argument("--max-message-mb", type=float, default=None, metavar="MB",
                   help="largest gRPC message accepted (default 512)")
    sec = p.add_argument_group("transport security (see `fedcure certs`)")
    sec.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM)")
    sec.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    sec.add_argument("--tls-client-ca", metavar="FILE",
                     help="CA (PEM) that client certificates must chain to: mutual TLS")
    sec.add_argument("--insecure", action="store_true",
                     help="serve plaintext gRPC without TLS (local testing only)")
    sec.add_argument("--edge-tokens", metavar="FILE",
                     help="JSON edge id -> token (`fedcure certs --edges M` writes "
                          "edge-tokens.json): edge m must send its own token and may act only "
                          "as edge m; the shared --token is then for clients only")
    sec.add_argument("--edge-certs", action="store_true",
                     help="with --tls-client-ca: every edge must present its own client "
                          "certificate (CN fedcure-edge-<m>, `fedcure certs --edges M`)")
    live = p.add_argument_group("live view (a web page and Prometheus /metrics)")
    live.add_argument("--dashboard", metavar="HOST:PORT",
                      help="serve the live page and /metrics here (loopback, e.g. "
                           "127.0.0.1:8080; any other address needs --dashboard-token); "
                           "HTTPS with --tls-cert/--tls-key")
    live.add_argument("--dashboard-token",
                      default=os.environ.get("FEDCURE_DASHBOARD_TOKEN", ""),
                      help="secret every request to the live view must carry (Authorization: "
                           "Bearer TOKEN, or ?token=TOKEN in the page's address; default "
                           "$FEDCURE_DASHBOARD_TOKEN)")
    live.add_argument("--dashboard-mode", choices=["deployment", "testbed"],
                      default="deployment",
                      help="what the live page's title calls this run (fedcure testbed "
                           "passes testbed; default deployment)")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p


class DashboardBindError(OSError):
    """The live view's address cannot be bound."""


def make_config(args: argparse.Namespace) -> tuple[Any, bool]:
    """The configuration from the file and the flags; and whether a dataset was named."""
    from fedcure_app.config import ConfigError, FedCureConfig, apply_flat, load_config

    cfg = load_config(args.config) if args.config else FedCureConfig()
    if args.config:  # said at start-up: a compose file's settings never change a run unsaid
        from cloud_server.config_changes import changed_knobs

        changed = changed_knobs(cfg)
        logging.getLogger("fedcure.cloud").info(
            "--config %s sets %s", args.config,
            "; ".join(changed) if changed else "nothing other than the defaults")
    named = args.dataset is not None or "dataset" in cfg.data.model_fields_set
    holdout_set = "holdout" in cfg.data.model_fields_set
    flat: dict[str, Any] = {"num-edges": args.edges, "num-clients": args.expected_clients}
    if args.rounds is not None:
        flat["global-rounds"] = args.rounds
    if args.dataset is not None:
        flat["dataset"] = args.dataset
    if args.data_dir is not None:
        flat["data-dir"] = args.data_dir
    if args.method is not None:
        flat["method"] = args.method
    if args.max_client_weight is not None:
        flat["max-client-weight"] = args.max_client_weight
    if args.task is not None:
        from fedcure_app.data.own_federation import with_task
        from fedcure_app.data.task import load_task

        if args.dataset is not None:
            raise ConfigError(f"--dataset {args.dataset}: not used with --task")
        task = load_task(args.task)
        from fedcure_app.models import check_task_model

        check_task_model(task)  # a model that cannot be built is refused now, not at Register
        cfg = with_task(apply_flat(cfg, {"label-column": args.label_column}), task)
    if args.test_data is not None and cfg.task is None:
        raise ConfigError("--test-data: only with --task (a built-in dataset brings its own "
                          "test split)")
    if args.test_data is not None and not holdout_set:
        # a central test set: the clients (handed this configuration) train on all they hold
        cfg = apply_flat(cfg, {"holdout": 0.0})
    cfg = apply_flat(cfg, flat)
    if args.formation is not None:
        cfg = apply_flat(cfg, {"formation": args.formation})
    return cfg, named or args.test_data is not None


def make_evaluator(cfg: Any, test_data: str | None = None) -> tuple[Any, int]:
    """``arrays -> (accuracy, loss)`` on the configured dataset's test split, or with a task on
    ``test_data`` (all of it, read as a client reads its data); and the classes."""
    import torch

    from fedcure_app.models import build_model, set_weights
    from fedcure_app.training import evaluate

    if cfg.task is not None:
        import numpy as np

        from fedcure_app.data.own import normalise_x, read_test_data

        part = read_test_data(test_data, cfg.task, label_column=cfg.data.label_column)
        model = build_model(cfg.task)
        x = torch.from_numpy(normalise_x(part.x_test, cfg.task))
        y = torch.from_numpy(part.y_test.astype(np.int64))
        classes = cfg.task.num_classes
    else:
        from fedcure_app.data import load_dataset

        ds = load_dataset(cfg.data.dataset, cfg.data.data_dir)
        model = build_model(ds.name, ds.num_classes)
        x = torch.from_numpy(ds.x_test)
        y = torch.from_numpy(ds.y_test)
        classes = ds.num_classes

    def evaluator(arrays: list[Any]) -> tuple[float, float, list[float | None]]:
        set_weights(model, arrays)
        res = evaluate(model, x, y)
        per_class = [None if v != v else float(v) for v in res.class_accuracy]  # NaN: no sample
        return float(res.accuracy), float(res.loss), per_class

    return evaluator, int(classes)


def init_weights(args: argparse.Namespace, cfg: Any) -> Any:
    """The weights of ``--init-model`` checked against the run's task (None without it)."""
    if args.init_model is None:
        return None
    from fedcure_app.config import ConfigError
    from fedcure_app.trained.files import ModelFileError, load_weights, run_task

    try:
        return load_weights(args.init_model, run_task(cfg))
    except ModelFileError as err:
        raise ConfigError(f"--init-model: {err}") from None


async def _run(args: argparse.Namespace, cfg: Any, evaluator: Any, credentials: Any = None,
               initial: Any = None) -> int:
    from cloud_server.identity import EdgeCredentials, load_edge_tokens
    from cloud_server.server import serve
    from cloud_server.service import CloudService

    log = logging.getLogger("fedcure.cloud")
    from fedcure_app.data.loader import unused_data_dir

    if getattr(cfg, "task", None) is None and (note := unused_data_dir(cfg.data.dataset,
                                                                       cfg.data.data_dir)):
        log.warning("%s", note)
    creds = EdgeCredentials(load_edge_tokens(args.edge_tokens) if args.edge_tokens else None,
                            require_certs=args.edge_certs)
    if initial is not None:
        log.info("starting from the model in %s", args.init_model)
    service = CloudService(
        cfg, expected_clients=args.expected_clients, out_dir=Path(args.out),
        initial_arrays=initial,
        register_timeout_s=args.register_timeout, token=args.token, evaluator=evaluator,
        write_plots=not args.no_plots,
        checkpoint_dir=None if args.no_checkpoint else Path(args.out) / "checkpoint",
        resume=args.resume, edge_credentials=creds,
        # a task without --test-data: evaluated on the clients' held-out parts (never with
        # --no-eval)
        federated_evaluation=False if args.no_eval else None,
    )
    stop = asyncio.Event()
    got: list[str] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        def handler(s: signal.Signals = sig) -> None:
            got.append(s.name)
            log.info("%s received: stopping", s.name)
            stop.set()
        loop.add_signal_handler(sig, handler)

    def bound(port: int) -> None:
        host = args.listen.rsplit(":", 1)[0]
        log.info("listening on %s:%d", host, port)
        from cloud_server.security import describe_transport

        level, how = describe_transport(insecure=args.insecure, tls_cert=args.tls_cert,
                                        tls_client_ca=args.tls_client_ca)
        log.log(level, "serving %s", how)
        if not creds.bound:
            log.warning("edge identities are not bound to credentials: anyone with the shared "
                        "token may act as any edge (use --edge-tokens or --edge-certs)")

    max_bytes = None if args.max_message_mb is None else int(args.max_message_mb * 2**20)
    dashboard = None
    if args.dashboard:
        from cloud_server.live import start_dashboard
        from fedcure_app.live.server import check_bind

        host, port = check_bind(args.dashboard, args.dashboard_token)
        try:
            tls = (args.tls_cert, args.tls_key) if args.tls_cert and args.tls_key else None
            dashboard = start_dashboard(service.controller, host, port, args.dashboard_token,
                                        tls=tls, mode=args.dashboard_mode)
        except OSError as err:
            raise DashboardBindError(f"--dashboard {args.dashboard}: cannot listen there "
                                     f"({err.strerror or err})") from None
    try:
        result = await serve(service, args.listen, on_bound=bound, stop=stop,
                             credentials=credentials, max_message_bytes=max_bytes)
    finally:
        if dashboard is not None:
            dashboard.stop()
    if result is None:
        await write_stopped(service.controller, args.out)
    return 0


async def write_stopped(controller: Any, out: str) -> dict[str, Any] | None:
    """The end of a cloud stopped before ``serve`` returned a result: the partial results of
    the rounds done, written once (:meth:`FormedRun.write_on_stop`). A run that finished
    meanwhile keeps the results it wrote, waited for while it writes them. Returns the
    results (None: training never started, nothing written)."""
    log = logging.getLogger("fedcure.cloud")
    if controller.formed is None or not controller.records:
        log.info("stopped before training started; nothing written")
        return None
    result, wrote = await asyncio.to_thread(controller.formed.write_on_stop)
    if wrote:
        log.info("stopped after %d of %d rounds; partial results in %s",
                 result["rounds"], controller.cfg.run.global_rounds, out)
    elif result is None:
        log.warning("the run finished but writing its results failed (logged above)")
    else:
        log.info("the run had finished: its results in %s are kept", out)
    return result


def main(argv: list[str] | None = None) -> int:
    # gRPC core logs bind failures on its own; keep stderr to our one line
    # (libraries such as Ray set GRPC_VERBOSITY=ERROR, which still prints them; keep DEBUG/INFO)
    from fedcure_app.runtime.processes import quiet_grpc

    quiet_grpc()
    args = build_parser().parse_args(argv)
    from fedcure_app.data.model_consent import trust_working_folder

    trust_working_folder()  # --task is the operator's own file
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from fedcure_app.config import ConfigError, apply_flat

    try:
        if args.expected_clients < 1 or args.edges < 1:
            raise ConfigError("--expected-clients and --edges must be >= 1")
        from cloud_server.server import parse_listen

        parse_listen(args.listen)
        from cloud_server.security import transport_from_flags

        if args.dashboard:
            from fedcure_app.live.server import DashboardError, check_bind

            try:
                check_bind(args.dashboard, args.dashboard_token)
            except DashboardError as err:
                raise ConfigError(str(err)) from None
        if args.edge_certs and not args.tls_client_ca:
            raise ConfigError("--edge-certs needs mutual TLS (--tls-client-ca)")
        if args.edge_tokens:
            from cloud_server.identity import load_edge_tokens

            tokens = load_edge_tokens(args.edge_tokens)
            missing = sorted(set(range(args.edges)) - set(tokens))
            if missing:
                raise ConfigError(f"--edge-tokens {args.edge_tokens} has no token for edges "
                                  f"{missing[:10]}")
        credentials = transport_from_flags(
            insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca, enforce=ENFORCE_TLS)
        cfg, named = make_config(args)
        evaluator = None
        if named and not args.no_eval and (cfg.task is None or args.test_data):
            evaluator, classes = make_evaluator(cfg, args.test_data)
            if classes != cfg.federation.num_classes:
                cfg = apply_flat(cfg, {"num-classes": classes})
        from cloud_server.server import AddressInUse

        try:
            return asyncio.run(_run(args, cfg, evaluator, credentials, init_weights(args, cfg)))
        except (AddressInUse, DashboardBindError) as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2
    except (ConfigError, ValueError, FileNotFoundError, OSError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover - signal handlers take SIGINT
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
