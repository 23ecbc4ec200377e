"""Two ``fedcure launch`` runs of the same honest clients, the second with two hostile ones
beside them: does the federation go on, and what do the honest clients' model lose?

The data: scikit-learn's digits as feature rows (64 features, 10 classes), 397 held out as
the central test set (``--test-data``), the rest cut into 4 honest clients (CSV). The hostile
run adds ``bad`` (100 of site-1's rows with one cell ``1e39``: not finite once cast to float32,
refused when read) and ``liar`` (a copy of site-0's rows that registers 1000× its histogram and
sample count, consistent so registration takes them, and says 10⁹ examples in every reply:
``bench/hostile/sitecustomize.py``). Both runs: 2 edges, 16 rounds, τ_e 2, τ_c 10, lr 0.1,
seed 0, the MLP. Prints one JSON line per run (exit code, final accuracy, withdrawn clients,
coalitions, rounds per coalition, δ) and the accuracy difference.

    python3 bench/hostile_launch.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TASK = ('[task]\nkind = "tabular"\nclasses = ["0","1","2","3","4","5","6","7","8","9"]\n'
        'features = 64\nmodel = "mlp"\n')


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    lines = [",".join([f"f{j}" for j in range(x.shape[1])] + ["label"])]
    lines += [",".join([f"{v:g}" for v in row] + [str(int(t))]) for row, t in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")


def write_data(base: Path, hostile: bool) -> Path:
    """The clients' folder (and ``base/test.csv``); returns the folder."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(y))
    test, parts = idx[:397], np.array_split(idx[397:], 4)
    write_csv(base / "test.csv", x[test], y[test])
    folder = base / ("clients-hostile" if hostile else "clients-honest")
    folder.mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(parts):
        write_csv(folder / f"site-{k}.csv", x[part], y[part])
    if hostile:
        write_csv(folder / "liar.csv", x[parts[0]], y[parts[0]])
        bad = x[parts[1][:100]].copy()
        bad[4, 3] = 1e39
        write_csv(folder / "bad.csv", bad, y[parts[1][:100]])
    return folder


def launch(base: Path, hostile: bool) -> dict:
    folder = write_data(base, hostile)
    (base / "task.toml").write_text(TASK)
    out = base / ("out-hostile" if hostile else "out-honest")
    env = dict(os.environ)
    if hostile:  # the liar is the second entry (bad, liar, site-0, ...): client1
        entries = sorted(p.stem for p in folder.glob("*.csv"))
        env.update(NEMESIS_LIAR=str(entries.index("liar")), PYTHONPATH=os.pathsep.join(
            [str(ROOT / "bench" / "hostile"), *filter(None, [env.get("PYTHONPATH")])]))
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--task", str(base / "task.toml"),
            "--clients-data", str(folder), "--test-data", str(base / "test.csv"),
            "--edges", "2", "--rounds", "16", "--tau-e", "2", "--tau-c", "10", "--lr", "0.1",
            "--eval-every", "4", "--seed", "0", "--timeout", "1200", "--no-progress",
            "--no-dashboard", "--out", str(out)]
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    path = out / "result.json"
    res = json.loads(path.read_text()) if path.is_file() else {}
    part = res.get("participation", {})
    return {"run": "hostile" if hostile else "honest", "exit": done.returncode,
            "seconds": round(time.monotonic() - t0), "final_accuracy": res.get("final_accuracy"),
            "withdrawn": res.get("withdrawn"),
            "registered": {c["name"]: c["samples"] for c in res.get("clients", [])},
            "coalitions": res.get("coalitions"), "rounds": part.get("rounds"),
            "delta": [round(d, 4) for d in part.get("delta", [])],
            "stderr_tail": done.stderr[-600:] if done.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="run folder (default: a temp dir)")
    args = p.parse_args(argv)
    base = args.out or Path(tempfile.mkdtemp(prefix="hostile-launch-"))
    base.mkdir(parents=True, exist_ok=True)
    runs = [launch(base, hostile) for hostile in (False, True)]
    for r in runs:
        print(json.dumps(r), flush=True)
    if all(r["final_accuracy"] is not None for r in runs):
        diff = 100 * (runs[1]["final_accuracy"] - runs[0]["final_accuracy"])
        print(f"accuracy with the hostile clients minus without: {diff:+.2f} points")
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
