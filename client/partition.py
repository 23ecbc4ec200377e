"""The client's partition, cut in a child process so that the long-lived role stays small.

Cutting a partition reads the whole dataset (MNIST: 47 MB of pixels), the NumPy arrays of the
partition and the dataset readers. Done in ``fedcure-client`` itself, that memory, and NumPy's,
would stay with a process that afterwards only relays (about 10 MB PSS kept, 97 MB at the cut on
MNIST; ``bench/footprint.py``). :func:`cut_partition` runs::

    python -m client.partition --config FILE --index I --name NAME --out node-data.npz

which computes exactly what ``fedcure simulate`` gives partition ``I``
(:func:`client.association.build_node_data`), writes the node data file and prints one JSON line
(:class:`Partition`: samples, label counts, initial ES, device profile). A failure is one line
on its standard error, which :func:`cut_partition` raises as the error it was (a
:class:`~client.association.ClientError` for an empty partition, a
:class:`~fedcure_app.data.errors.DatasetError` for missing or unreadable data).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: exit codes of the child: the error classes :func:`cut_partition` raises again
EXIT_CLIENT, EXIT_DATASET = 3, 4


@dataclass(frozen=True)
class Partition:
    """What the role needs of its partition: sample count, samples per class, initial ES
    (edge index) and device profile; the samples themselves are in ``data_file``."""

    data_file: Path
    samples: int
    label_counts: list[int]
    home: int
    profile: Any  # fedcure_app.devices.DeviceProfile
    #: own data: the model's signature (JSON) and the ε of the noise on ``label_counts``
    model_signature: str = ""
    histogram_epsilon: float = 0.0
    #: classes with fewer samples than this are reported as 0 in ``label_counts``
    histogram_min_count: int = 0


def run_data_child(cfg: Any, module: str, args: list[str], out: Path, timeout_s: float,
                   stop: threading.Event | None) -> Partition | None:
    """Run ``python -m module --config FILE --out out *args`` (FILE: ``cfg`` as JSON beside
    ``out``, removed afterwards), the one-shot child that writes a client's node data file, and
    return the :class:`Partition` its JSON line describes (None when ``stop`` is set first).
    Raises :class:`subprocess.TimeoutExpired` and :class:`client.children.ChildFailed` as
    :func:`client.children.json_child` does."""
    from fedcure_app.devices import parse_profile

    from client.children import json_child

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=out.parent,
                                     prefix=".data-config-", delete=False) as f:
        json.dump(cfg.model_dump(mode="json"), f)
        config_file = Path(f.name)
    try:
        # -P: the working folder is not put on sys.path (a task that came over the network
        # imports only what is installed or on PYTHONPATH: fedcure_app.data.model_consent)
        reply = json_child([sys.executable, "-P", "-m", module, "--config", str(config_file),
                            "--out", str(out), *args], timeout_s, stop)
    finally:
        config_file.unlink(missing_ok=True)
    if reply is None:
        return None
    return Partition(data_file=out, samples=int(reply["samples"]),
                     label_counts=[int(c) for c in reply["label_counts"]],
                     home=int(reply["home"]), profile=parse_profile(reply["profile"]),
                     model_signature=json.dumps(reply["model_signature"])
                     if "model_signature" in reply else "",
                     histogram_epsilon=float(reply.get("histogram_epsilon", 0.0)),
                     histogram_min_count=int(reply.get("histogram_min_count", 0)))


def cut_partition(cfg: Any, index: int, name: str, out: Path, timeout_s: float = 1800.0,
                  stop: threading.Event | None = None) -> Partition | None:
    """Partition ``index`` of ``cfg``'s dataset, written to ``out`` by a child process
    (seconds: ``timeout_s`` for the child); None when ``stop`` is set first (SIGTERM: the child
    is stopped; it writes the file atomically, so none is left half-written)."""
    from client.association import ClientError
    from client.children import ChildFailed

    try:
        return run_data_child(cfg, "client.partition",
                              ["--index", str(index), "--name", name], out, timeout_s, stop)
    except subprocess.TimeoutExpired:
        raise ClientError(f"cutting partition {index} took more than {timeout_s:.0f} s"
                          ) from None
    except ChildFailed as err:
        if err.returncode == EXIT_DATASET:
            # imported only here: the data package loads NumPy, which the role otherwise never
            from fedcure_app.data.errors import DatasetError

            raise DatasetError(err.tail) from None
        if err.returncode == EXIT_CLIENT:
            raise ClientError(err.tail) from None
        raise ClientError(f"cutting partition {index} failed: {err.tail}") from None


def main(argv: list[str] | None = None) -> int:
    """The child: cut, write, print the :class:`Partition` facts as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m client.partition",
                                description="Cut one client's partition into a node data file.")
    p.add_argument("--config", required=True, help="the run's configuration (JSON file)")
    p.add_argument("--index", required=True, type=int, help="partition index")
    p.add_argument("--name", required=True, help="the client's name (kept in the file)")
    p.add_argument("--out", required=True, help="node data file to write (.npz)")
    args = p.parse_args(argv)
    from fedcure_app.config import build_config
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.flower.node_data import save_node_data

    from client.association import ClientError, build_node_data

    try:
        cfg = build_config(json.loads(Path(args.config).read_text()))
        data, home = build_node_data(cfg, args.index, args.name)
        save_node_data(args.out, data)
    except ClientError as err:
        print(err, file=sys.stderr)
        return EXIT_CLIENT
    except DatasetError as err:
        print(err, file=sys.stderr)
        return EXIT_DATASET
    except (OSError, ValueError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"samples": int(len(data.y)),
                      "label_counts": data.label_counts.tolist(), "home": home,
                      "profile": data.profile.model_dump(mode="json")}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
