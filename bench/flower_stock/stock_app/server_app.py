"""Stock ServerApp: ``flwr.serverapp.strategy.FedAvg`` over ``clients-per-round`` sampled nodes
for ``num-server-rounds`` rounds, central test-set evaluation every ``eval-every`` rounds.

Writes ``{"seconds": …, "rounds": …, "accuracy": …}`` to ``out-file`` when the run config
names one: the wall time of ``strategy.start`` alone (Ray and actor start-up excluded).
"""

from __future__ import annotations

import json
import time

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedcure_app.runtime.threads import apply_thread_policy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    import torch

    from fedcure_app.data import load_dataset
    from fedcure_app.models import build_model
    from fedcure_app.training import evaluate

    apply_thread_policy(where="stock ServerApp")
    rc = context.run_config
    n = int(rc["num-clients"])
    k = int(rc["clients-per-round"])
    every = int(rc["eval-every"])
    ds = load_dataset(str(rc["dataset"]), str(rc["data-dir"]) or None)
    xt, yt = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
    torch.manual_seed(int(rc["seed"]))
    model = build_model(str(rc["dataset"]), 10)
    accs: list[float] = []

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0 or server_round % every:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        res = evaluate(model, xt, yt)
        accs.append(res.accuracy)
        return MetricRecord({"accuracy": res.accuracy, "loss": res.loss})

    strategy = FedAvg(fraction_train=k / n, fraction_evaluate=0.0, min_train_nodes=k,
                      min_available_nodes=n)
    t0 = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=int(rc["num-server-rounds"]), train_config=ConfigRecord({}),
                   evaluate_fn=central)
    seconds = time.perf_counter() - t0
    if str(rc.get("out-file", "")):
        with open(str(rc["out-file"]), "w") as fh:
            json.dump({"seconds": seconds, "rounds": int(rc["num-server-rounds"]),
                       "accuracy": accs[-1] if accs else None}, fh)
