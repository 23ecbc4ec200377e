"""This device's training rate on a dataset's model: samples per second of plain-SGD steps.

    python -m client.rate --dataset D [--device cpu|cuda|auto] [--batch-size B]

prints one JSON line ``{"dataset", "device", "batch_size", "samples_per_s"}``. The steps are
the trainer's own (:func:`fedcure_app.training.train_local` on uint8 pixels normalised per
batch, one torch thread by the thread policy) on random images of the dataset's shape, so no
dataset file is needed; the rate is :func:`fedcure_app.devices.calibrate_host`'s (one warm-up
step, then doubling step counts until a run lasts ``min_seconds``). ``fedcure-client --probe``
prints it, and a ``--device cuda`` client registers it (the cloud's latency prior then takes
its compute time per sample as 1/rate at f_max).
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def samples_per_s(dataset: str, device: str = "cpu", batch_size: int = 32,
                  min_seconds: float = 1.0, samples: int = 512, seed: int = 0) -> float:
    """Samples/s that ``train_local`` reaches on ``device`` with ``dataset``'s model (s⁻¹)."""
    import torch

    from fedcure_app.data.specs import SPECS, canonical_name
    from fedcure_app.devices import calibrate_host
    from fedcure_app.models import build_model
    from fedcure_app.training import PixelNorm, resolve_device, train_local

    spec = SPECS[canonical_name(dataset)]
    dev = resolve_device(device)
    rng = np.random.default_rng(seed)
    n = max(samples, batch_size)
    x = torch.from_numpy(rng.integers(0, int(spec.pixel_max) + 1, (n, *spec.input_shape),
                                      dtype=np.uint8)).to(dev)
    y = torch.from_numpy(rng.integers(0, spec.num_classes, n, dtype=np.int64)).to(dev)
    model = build_model(spec.name, spec.num_classes).to(dev)
    norm = PixelNorm.for_dataset(spec.name)

    def train(steps: int) -> None:
        train_local(model, x, y, steps=steps, lr=0.01, batch_size=batch_size, seed=seed,
                    norm=norm)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return float(calibrate_host(train, samples_per_step=batch_size, min_seconds=min_seconds))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.rate", description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--min-seconds", type=float, default=1.0)
    args = p.parse_args(argv)
    from fedcure_app.training import resolve_device

    used = resolve_device(args.device).type
    rate = samples_per_s(args.dataset, used, args.batch_size, args.min_seconds)
    print(json.dumps({"dataset": args.dataset, "device": used, "batch_size": args.batch_size,
                      "samples_per_s": rate}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
