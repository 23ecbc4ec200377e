"""Flat synchronous FedAvg as a Flower user runs it: ``flwr.serverapp.strategy.FedAvg`` in a
stock ServerApp, with the project's own ClientApp training code on every SuperNode.

``fedcure testbed --peer fedavg`` (:mod:`fedcure_app.cli.testbed_peer`) submits this App to
one stock ``flower-superlink``; the testbed's clients are stock ``flower-supernode``\\ s, each
starting a ``flwr-clientapp`` process per message (Flower's own runtime, no FedCure patches).

- ``server``: waits until ``num-clients`` SuperNodes are connected, then runs Flower's FedAvg
  (McMahan et al., AISTATS 2017: every round samples ``fraction`` of the nodes, waits for all of
  them and averages their models weighted by ``num-examples``) for ``num-rounds`` rounds from
  the model FedCure's cloud starts from (the dataset's CNN seeded with ``seed``). After every
  round it evaluates the global model centrally on the dataset's test split, as FedCure's cloud
  does, and appends ``{"round", "time_s", "accuracy", "loss"}`` to ``records-file`` (JSON lines;
  ``time_s``: seconds since round 1 was sent, the cloud's clock starts at its round 0); it
  names the strategy class in ``strategy-file`` before round 1 and in ``done-file`` at the end.
- ``client``: FedCure's ClientApp ``train`` (:mod:`fedcure_app.flower.client_app`: the node's
  data file, ``train_local``, the CPU quota of the device at f_max, since FedAvg directs no
  frequency) with the seed of each round's local training derived from the round and the
  client as the edges derive theirs (:func:`fedcure_app.tasks.client_train_seed`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedcure_app.runtime.threads import apply_thread_policy

#: ``module:attribute`` of the two components, for the generated App directory
SERVERAPP = "fedcure_app.flower.peer_fedavg:server"
CLIENTAPP = "fedcure_app.flower.peer_fedavg:client"
#: seconds between the ServerApp's looks at the connected nodes before round 1
NODE_POLL_S = 0.5

server = ServerApp()
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    """FedCure's ClientApp ``train`` on this node's own data, seeded per round and client."""
    from fedcure_app.flower import client_app
    from fedcure_app.tasks import client_train_seed

    conf = msg.content["config"]
    ident = int(context.node_config["client-id"])
    conf["client-id"] = ident
    conf["seed"] = int(client_train_seed(int(conf["seed"]), int(conf["server-round"]), ident))
    return client_app.train(msg, context)


def _wait_for_nodes(grid: Grid, count: int) -> None:
    while len(list(grid.get_node_ids())) < count:
        time.sleep(NODE_POLL_S)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Flower's FedAvg for ``num-rounds`` rounds, evaluated centrally after every round."""
    import torch

    from fedcure_app.data import load_dataset
    from fedcure_app.models import build_model, get_weights, set_weights
    from fedcure_app.training import evaluate

    apply_thread_policy(where="FedAvg ServerApp")
    rc = context.run_config
    n = int(rc["num-clients"])
    ds = load_dataset(str(rc["dataset"]), str(rc["data-dir"]) or None)
    xt, yt = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
    torch.manual_seed(int(rc["seed"]))
    model = build_model(ds.name, ds.num_classes)
    records = Path(str(rc["records-file"]))
    t0 = [time.monotonic()]

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        set_weights(model, arrays.to_numpy_ndarrays())
        res = evaluate(model, xt, yt)
        row = {"round": server_round, "time_s": time.monotonic() - t0[0] if server_round else 0.0,
               "accuracy": float(res.accuracy), "loss": float(res.loss)}
        with records.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        return MetricRecord({"accuracy": res.accuracy, "loss": res.loss})

    fraction = float(rc["fraction"])
    sampled = max(1, round(fraction * n))
    strategy = FedAvg(fraction_train=fraction, fraction_evaluate=0.0, min_train_nodes=sampled,
                      min_available_nodes=n)
    name = f"{type(strategy).__module__}.{type(strategy).__name__}"
    Path(str(rc["strategy-file"])).write_text(json.dumps({"strategy": name}))
    _wait_for_nodes(grid, n)
    t0[0] = time.monotonic()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(get_weights(model)),
                   num_rounds=int(rc["num-rounds"]), evaluate_fn=central,
                   train_config=ConfigRecord({"tau-c": int(rc["tau-c"]), "lr": float(rc["lr"]),
                                              "batch-size": int(rc["batch-size"]),
                                              "seed": int(rc["seed"]), "freq-ghz": 0.0}))
    Path(str(rc["done-file"])).write_text(json.dumps({"strategy": name, "complete": True}))


__all__ = ["CLIENTAPP", "SERVERAPP", "client", "server"]
