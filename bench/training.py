"""Local-training throughput: ``train_local`` against a bare PyTorch loop on real MNIST.

Both run the MNIST CNN at the same batch size for the same number of SGD steps, from the same
initial weights, over the same seeded batch order (so they must end with identical weights, which
is checked). Each is warmed up, then timed ``--repeats`` times in alternating order; the best time
of each is compared. Exits 1 when ``train_local`` is slower than ``--max-ratio`` × the bare loop.

Evaluation throughput (``evaluate`` on the 10 000 test images, batch ``--eval-batch-size``) is
reported next to a bare ``inference_mode`` loop the same way.

    python3 bench/training.py [--data-dir ../shared/data/mnist] [--steps 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gzip
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedcure_app.models import build_model, get_weights, set_weights
from fedcure_app.training import configure_threads, evaluate, train_local

log = logging.getLogger("bench.training")

REPO = Path(__file__).resolve().parent.parent
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip'd or not) as a numpy array of its declared type and shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file")
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if data[2] not in dtypes:
        raise ValueError(f"{path}: unknown IDX element type 0x{data[2]:02x}")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=dtypes[data[2]], offset=4 + 4 * ndim)
    if arr.size != math.prod(shape):
        raise ValueError(f"{path}: header says {shape} but holds {arr.size} values")
    return arr.reshape(shape)


def load_mnist(data_dir: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST ``train`` or ``t10k`` as normalised float32 (N, 1, 28, 28) and int64 labels."""
    raw = data_dir / "raw" if (data_dir / "raw").is_dir() else data_dir
    images = raw / f"{split}-images-idx3-ubyte.gz"
    labels = raw / f"{split}-labels-idx1-ubyte.gz"
    for p in (images, labels):
        if not p.is_file():
            raise FileNotFoundError(f"MNIST file missing: {p} (pass --data-dir)")
    x = read_idx(images).astype(np.float32) / 255.0
    x = (x - MNIST_MEAN) / MNIST_STD
    y = read_idx(labels).astype(np.int64)
    return torch.from_numpy(x[:, None, :, :].copy()), torch.from_numpy(y)


def bare_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float,
               batch_size: int, seed: int) -> None:
    """The reference: the same SGD steps over the same batch order, nothing else."""
    n = x.shape[0]
    per_epoch = math.ceil(n / batch_size)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    perm = torch.empty(0, dtype=torch.int64)
    for step in range(steps):
        b = step % per_epoch
        if b == 0:
            perm = torch.randperm(n, generator=gen)
        idx = perm[b * batch_size : (b + 1) * batch_size]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx)).backward()
        opt.step()


def bare_eval(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """The reference evaluation loop; returns accuracy."""
    model.eval()
    correct = 0
    with torch.inference_mode():
        for s in range(0, x.shape[0], batch_size):
            correct += int((model(x[s : s + batch_size]).argmax(1) == y[s : s + batch_size]).sum())
    return correct / x.shape[0]


def best_of(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time (s) of each function over ``repeats`` rounds, alternating the order."""
    best = {k: math.inf for k in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "mnist")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--eval-batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument("--max-ratio", type=float, default=1.1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)

    threads = configure_threads(args.threads)
    x, y = load_mnist(args.data_dir, "train")
    xt, yt = load_mnist(args.data_dir, "t10k")
    torch.manual_seed(0)
    model = build_model("mnist")
    init = get_weights(model)
    log.info("MNIST CNN, batch %d, %d steps, %d threads, train %d / test %d images",
             args.batch_size, args.steps, threads, len(y), len(yt))

    # Same start, same seed: both paths must land on the same weights.
    train_local(model, x, y, steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=1)
    ours = get_weights(model)
    set_weights(model, init)
    bare_train(model, x, y, args.steps, args.lr, args.batch_size, seed=1)
    same = all(np.array_equal(a, b) for a, b in zip(ours, get_weights(model)))
    log.info("identical weights after %d steps: %s", args.steps, same)

    def run_ours() -> None:
        set_weights(model, init)
        train_local(model, x, y, steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=1)

    def run_bare() -> None:
        set_weights(model, init)
        bare_train(model, x, y, args.steps, args.lr, args.batch_size, seed=1)

    best = best_of({"train_local": run_ours, "bare loop": run_bare}, args.repeats)
    samples = args.steps * args.batch_size
    ratio = best["train_local"] / best["bare loop"]
    for name, sec in best.items():
        log.info("  %-12s %8.3f s  %9.0f samples/s", name, sec, samples / sec)
    log.info("  train_local / bare time ratio: %.3f (limit %.2f)", ratio, args.max_ratio)

    eval_best = best_of({
        "evaluate": lambda: evaluate(model, xt, yt, batch_size=args.eval_batch_size),
        "bare eval": lambda: bare_eval(model, xt, yt, args.eval_batch_size),
    }, max(1, args.repeats // 2 + 1))
    acc = evaluate(model, xt, yt).accuracy
    for name, sec in eval_best.items():
        log.info("  %-12s %8.3f s  %9.0f samples/s (batch %d)", name, sec, len(yt) / sec,
                 args.eval_batch_size)
    log.info("  test accuracy after %d steps: %.4f", args.steps, acc)

    ok = same and ratio <= args.max_ratio
    if not ok:
        why = "weights differ" if not same else f"ratio {ratio:.3f} > {args.max_ratio}"
        log.error("FAIL: %s", why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
