"""Driver process of the Ray cluster test: connect to ``$RAY_ADDRESS``, wait for ``NODES`` alive
nodes, run the FedCure Flower App there, print one ``RESULT {json}`` line.

    RAY_ADDRESS=127.0.0.1:PORT python3 -m tests.simulation.ray_driver NODES OUT_DIR '{run config}'
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(nodes: int, out_dir: str, overrides: dict) -> dict:
    import ray

    from fedcure_app.flower.run import run_flower_simulation

    # what Flower's backend does with init-args that name no num-cpus/num-gpus: ray.init()
    # picks the cluster up from RAY_ADDRESS
    ray.init(logging_level="ERROR", log_to_driver=False)
    deadline = time.monotonic() + 120
    while True:
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        if len(alive) >= nodes or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # the backend finds Ray initialised (connected to the cluster) and builds its actor pool
    # from the cluster's CPUs: one ClientApp actor per node here
    res = run_flower_simulation({**overrides, "out-dir": out_dir}, client_num_cpus=1.0)
    ray.shutdown()
    return {
        "cluster_nodes": sorted(n[:12] for n in alive),
        "ray_nodes": res["flower"]["ray_nodes"],
        "records": res["records"],
        "final_accuracy": res["final_accuracy"],
        "address": os.environ.get("RAY_ADDRESS"),
    }


if __name__ == "__main__":
    out = main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(out), flush=True)
