"""Stock ClientApp: ``local-steps`` SGD mini-batches on this node's partition, then reply.

What a user would write from Flower's PyTorch quickstart: the model and the data split are the
FedCure ones (same MNIST CNN, same 50-client partition), the loop is a plain one (seeded
``randperm`` batches, ``torch.optim.SGD``). Data are loaded once per process (a Ray actor serves
many virtual SuperNodes).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedcure_app.runtime.threads import apply_thread_policy

app = ClientApp()
_DATA: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}


def client_data(run_config) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every client's (x, y) of the FedCure partition described by the run config (cached)."""
    from fedcure_app.config import FedCureConfig, apply_flat
    from fedcure_app.federation import partition_for
    from fedcure_app.data import load_dataset

    key = (run_config["dataset"], run_config["data-dir"], int(run_config["num-clients"]),
           int(run_config["num-edges"]), int(run_config["seed"]))
    if key not in _DATA:
        ds = load_dataset(key[0], key[1] or None)
        cfg = apply_flat(FedCureConfig(), {"dataset": key[0], "num-clients": key[2],
                                           "num-edges": key[3], "seed": key[4]})
        part = partition_for(cfg, ds)
        x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
        _DATA[key] = [(x[torch.as_tensor(ix)], y[torch.as_tensor(ix)])
                      for ix in part.client_indices]
    return _DATA[key]


@app.train()
def train(msg: Message, context: Context) -> Message:
    """``local-steps`` mini-batches of plain SGD from the received model."""
    from fedcure_app.models import build_model

    apply_thread_policy(where="stock ClientApp")
    rc = context.run_config
    x, y = client_data(rc)[int(context.node_config["partition-id"])]
    model = build_model(str(rc["dataset"]), 10)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=float(rc["lr"]))
    batch = int(rc["batch-size"])
    gen = torch.Generator().manual_seed(int(msg.content["config"]["server-round"]))
    perm, pos = torch.randperm(len(y), generator=gen), 0
    model.train()
    for _ in range(int(rc["local-steps"])):
        if pos >= len(y):
            perm, pos = torch.randperm(len(y), generator=gen), 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)
