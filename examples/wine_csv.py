"""Write scikit-learn's wine data as one CSV per client, with label skew.

    python examples/wine_csv.py OUT [--clients 4] [--seed 0] [--alpha 1.0]

``OUT/client-00.csv`` …: the 13 chemical measurements as feature columns and a ``label``
column with the class names ``class_0``, ``class_1``, ``class_2``. Each class's 59–71 rows are
shared among the clients in seeded Dirichlet(``--alpha``) proportions (smaller alpha: more
skew), redrawn until every client has at least 10 rows. Runs offline (the data ships with
scikit-learn).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

#: Fewest rows any client gets (the split is redrawn until it holds).
MIN_ROWS = 10


def dirichlet_split(y: np.ndarray, clients: int, alpha: float, rng: np.random.Generator
                    ) -> list[np.ndarray]:
    """Row indices per client: each class split in Dirichlet(alpha) proportions."""
    for _ in range(1000):
        shares: list[list[int]] = [[] for _ in range(clients)]
        for cls in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == cls))
            cuts = (np.cumsum(rng.dirichlet([alpha] * clients))[:-1] * len(idx)).astype(int)
            for client, part in enumerate(np.split(idx, cuts)):
                shares[client].extend(part.tolist())
        if min(len(s) for s in shares) >= MIN_ROWS:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shares]
    raise SystemExit(f"no split gives every one of {clients} clients {MIN_ROWS} rows; "
                     "use fewer clients or a larger --alpha")


def write(out: Path, clients: int = 4, seed: int = 0, alpha: float = 1.0) -> list[Path]:
    """Write the client CSVs under ``out``; returns them in order."""
    from sklearn.datasets import load_wine

    if clients < 1 or alpha <= 0:
        raise SystemExit("need clients >= 1 and alpha > 0")
    wine = load_wine()
    names = [str(n) for n in wine.target_names]
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, rows in enumerate(dirichlet_split(wine.target, clients, alpha,
                                             np.random.default_rng(seed))):
        path = out / f"client-{i:02d}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow([*wine.feature_names, "label"])
            for r in rows:
                writer.writerow([repr(float(v)) for v in wine.data[r]] + [names[wine.target[r]]])
        files.append(path)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the client CSVs to")
    parser.add_argument("--clients", type=int, default=4, help="number of clients")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")
    parser.add_argument("--alpha", type=float, default=1.0,
                        help="Dirichlet concentration (smaller: more label skew)")
    args = parser.parse_args(argv)
    files = write(args.out, args.clients, args.seed, args.alpha)
    print(f"wrote {len(files)} client CSVs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
