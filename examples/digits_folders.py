"""Write scikit-learn's handwritten digits as per-client class folders with label skew.

    python examples/digits_folders.py OUT [--clients 8] [--classes-per-client 3] [--size 28]
                                          [--sites 2] [--seed 0] [--test-fraction 0]

``OUT/client-00/<digit>/<n>.png`` … : client i holds ``--classes-per-client`` digits. The
clients form ``--sites`` contiguous groups (devices in one place see similar data: with two
sites, clients 0-3 see five digits and clients 4-7 the other five), each site's digits dealt
round-robin among its clients after a seeded shuffle, and the images of each digit are shared
out among the clients that hold it, without overlap. The 8×8 images (values 0..16) are scaled to 0..255 and upscaled to
size×size greyscale PNGs (Pillow, bilinear). With ``--test-fraction F`` > 0 each client's
folders go under ``train/`` and a seeded fraction F of each class under ``test/``. Runs offline
(the digits ship with scikit-learn).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def client_classes(clients: int, per_client: int, num_classes: int, seed: int,
                   sites: int = 1) -> list[list[int]]:
    """The classes each client holds. The clients form ``sites`` contiguous groups (a site:
    devices in one place, which see similar data) and a seeded shuffle of the classes is cut
    into as many groups; a site's clients are dealt its classes round-robin (at most as many
    as the site has). With one site every client draws from every class."""
    order = np.random.default_rng(seed).permutation(num_classes)
    sites = max(1, min(sites, clients, num_classes))
    site_of = [i * sites // clients for i in range(clients)]
    groups = np.array_split(order, sites)
    out = []
    for i in range(clients):
        group = groups[site_of[i]]
        first = site_of.index(site_of[i])  # the site's first client
        k = min(per_client, len(group))
        out.append(sorted(int(group[((i - first) * k + j) % len(group)]) for j in range(k)))
    return out


def write(out: Path, clients: int = 8, classes_per_client: int = 3, size: int = 28,
          seed: int = 0, test_fraction: float = 0.0, sites: int = 2) -> list[Path]:
    """Write the client folders under ``out``; returns them in order."""
    from PIL import Image
    from sklearn.datasets import load_digits

    if not 1 <= classes_per_client <= 10 or clients < 1 or size < 1:
        raise SystemExit("need clients >= 1, 1 <= classes-per-client <= 10, size >= 1")
    if not 0 <= test_fraction < 1:
        raise SystemExit("--test-fraction must be in [0, 1)")
    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    rng = np.random.default_rng(seed)
    holds = client_classes(clients, classes_per_client, 10, seed, sites)
    folders = [out / f"client-{i:02d}" for i in range(clients)]
    for digit in range(10):
        owners = [i for i, h in enumerate(holds) if digit in h]
        if not owners:
            continue
        idx = rng.permutation(np.flatnonzero(digits.target == digit))
        for owner, share in zip(owners, np.array_split(idx, len(owners))):
            n_test = int(round(test_fraction * len(share)))
            for n, k in enumerate(share):
                part = ("test" if n < n_test else "train") if test_fraction > 0 else ""
                folder = folders[owner] / part / str(digit)
                folder.mkdir(parents=True, exist_ok=True)
                image = Image.fromarray(pixels[k])
                image.resize((size, size), Image.Resampling.BILINEAR).save(folder / f"{k:04d}.png")
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the client folders to")
    parser.add_argument("--clients", type=int, default=8, help="number of clients")
    parser.add_argument("--classes-per-client", type=int, default=3, help="digits per client")
    parser.add_argument("--size", type=int, default=28, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")
    parser.add_argument("--sites", type=int, default=2,
                        help="contiguous groups of clients that share a part of the digits "
                        "(1: every client draws from every digit)")
    parser.add_argument("--test-fraction", type=float, default=0.0,
                        help="fraction of each class under test/ (0: no train/test folders)")
    args = parser.parse_args(argv)
    folders = write(args.out, args.clients, args.classes_per_client, args.size, args.seed,
                    args.test_fraction, args.sites)
    print(f"wrote {len(folders)} clients to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
