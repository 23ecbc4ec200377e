"""End to end: ``fedcure launch --task T --clients-data DIR`` runs a federation over data that
lives with each client: client i reads entry i of DIR and nothing else (checked: every Python
process of the run logs, through an audit hook, each file or folder it opens under DIR), a
client whose data is refused exits 2 with one line that launch and the cloud both show, the
others form coalitions and train without waiting for it, and the coalitions are those
``fedcure simulate`` forms over the same entries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROUNDS = 3
#: the clients whose data fit the task, and the one in the middle that holds an unknown class
GOOD, BAD = (0, 1, 3, 4), 2
HOOK = textwrap.dedent('''
    import os, sys
    _log, _root = os.environ.get("OWN_OPEN_LOG"), os.environ.get("OWN_OPEN_ROOT")
    if _log and _root:
        _path = os.path.join(_log, f"{os.getpid()}.txt")
        with open(_path, "a") as _f:
            _f.write("argv " + " ".join(sys.argv) + "\\n")
        def _hook(event, args):
            if event in ("open", "os.listdir", "os.scandir") and args:
                try:
                    p = os.fsdecode(args[0])
                except TypeError:
                    return
                if p.startswith(_root):
                    with open(_path, "a") as f:
                        f.write(p + "\\n")
        sys.addaudithook(_hook)
''')


def write_clients(root: Path) -> None:
    """Five clients as class folders of 8×8 PNGs from scikit-learn's digits: four holding
    three digits each (label skew), one (``BAD``) holding a class the task does not know."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for c in GOOD:
        for digit in ((2 * c) % 10, (2 * c + 1) % 10, (2 * c + 2) % 10):
            folder = root / f"client-{c}" / str(digit)
            folder.mkdir(parents=True)
            for i in np.flatnonzero(d.target == digit)[c::5][:30]:
                Image.fromarray((d.images[i] * 255 / 16).astype(np.uint8)).save(
                    folder / f"{i}.png")
    odd = root / f"client-{BAD}" / "zebra"
    odd.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(odd / f"{i}.png")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    base = tmp_path_factory.mktemp("own")
    clients, out, hook, opens = base / "clients", base / "out", base / "hook", base / "opens"
    write_clients(clients)
    hook.mkdir()
    opens.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    task = base / "task.toml"
    task.write_text('[task]\nkind = "image"\nclasses = ["0","1","2","3","4","5","6","7","8",'
                    '"9"]\ninput-shape = [1, 8, 8]\nmean = [0.3]\nstd = [0.37]\n')
    env = dict(os.environ, OWN_OPEN_LOG=str(opens), OWN_OPEN_ROOT=str(clients),
               PYTHONPATH=os.pathsep.join([str(hook), *filter(None, [
                   os.environ.get("PYTHONPATH")])]))
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--task", str(task),
            "--clients-data", str(clients), "--edges", "2", "--rounds", str(ROUNDS),
            "--tau-e", "1", "--tau-c", "10", "--lr", "0.1", "--eval-every", "1",
            "--timeout", "500", "--no-progress", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=560, env=env)
    return base, clients, out, opens, done


def diagnostics(out: Path, done) -> str:
    parts = [f"exit {done.returncode}", done.stderr[-3000:]]
    for log in sorted((out / "logs").glob("*.log")):
        parts.append(f"--- {log.name}\n" + log.read_text()[-1500:])
    return "\n".join(parts)


def test_the_good_clients_train_and_the_refused_one_is_named_once(launched):
    _, _, out, _, done = launched
    assert done.returncode == 0, diagnostics(out, done)
    result = json.loads((out / "result.json").read_text())
    assert result["rounds"] == ROUNDS
    assert [c["name"] for c in result["clients"]] == [f"client-{i}" for i in GOOD]
    assert list(result["withdrawn"]) == [f"client-{BAD}"], diagnostics(out, done)
    # the cloud learns a code and a count; the client's own line names the class
    assert result["withdrawn"][f"client-{BAD}"] == "unknown-class: 1 class"
    refused = [line for line in done.stderr.splitlines() if "refused" in line]
    assert len(refused) == 1 and f"client-{BAD} refused" in refused[0] and "zebra" in refused[0]
    cloud_log = (out / "logs" / "cloud.log").read_text()
    assert cloud_log.count(f"client 'client-{BAD}' withdrew") == 1
    record = json.loads((out / "launch.json").read_text())
    assert record["exit_codes"][f"client{BAD}"] == 2
    assert all(code == 0 for name, code in record["exit_codes"].items()
               if name != f"client{BAD}")
    # formation ran over the label histograms of the clients' own data
    assert result["formed_jsd"] < result["initial_jsd"]


def test_each_client_opens_its_own_entry_and_nothing_else(launched):
    _, clients, out, opens, done = launched
    assert done.returncode == 0, diagnostics(out, done)
    touched: dict[str, set[str]] = {}
    for log in opens.glob("*.txt"):
        lines = log.read_text().splitlines()
        argv = lines[0]
        entries = {Path(p).relative_to(clients).parts[0] for p in lines[1:]
                   if Path(p) != clients}
        if not entries:
            continue
        assert len(entries) == 1, f"{argv} opened {sorted(entries)}"
        entry = entries.pop()
        assert f"--data {clients / entry}" in argv, f"{argv} opened {entry}"
        touched.setdefault(entry, set()).add(argv.split()[2] if len(argv.split()) > 2 else argv)
    # every client read its own data (the refused one too, to refuse it)
    assert sorted(touched) == [f"client-{i}" for i in range(5)]


def test_the_coalitions_are_those_simulate_forms_over_the_same_good_entries(launched):
    base, clients, out, _, done = launched
    assert done.returncode == 0, diagnostics(out, done)
    import shutil

    from fedcure_app.config import build_config
    from fedcure_app.simulation.engine import build_federation

    good = base / "good"
    for i in GOOD:
        shutil.copytree(clients / f"client-{i}", good / f"client-{i}")
    data = json.loads((out / "config.json").read_text())
    data["data"]["clients-data"] = str(good)
    data["federation"]["num-clients"] = len(GOOD)
    fed = build_federation(build_config(data))
    result = json.loads((out / "result.json").read_text())
    assert result["coalitions"] == fed.coalitions


def test_the_global_model_is_evaluated_on_the_clients_held_out_parts(launched):
    """No central test set: every evaluation is federated (the clients' held-out parts, through
    their edges), and the final accuracy equals a central evaluation of the final model on the
    union of those parts."""
    _, clients, out, _, done = launched
    assert done.returncode == 0, diagnostics(out, done)
    from fedcure_app.config import build_config
    from fedcure_app.data.own import pixel_norm, read_client_data
    from fedcure_app.models import build_model, set_weights
    from fedcure_app.protocol.codec import decode_arrays
    from fedcure_app.training import PixelNorm, evaluate

    result = json.loads((out / "result.json").read_text())
    assert result["evaluation"] == "federated" and result["initial_accuracy"] is not None
    cfg = build_config(json.loads((out / "config.json").read_text()))
    parts = [read_client_data(clients / f"client-{i}", cfg.task, holdout=cfg.data.holdout,
                              seed=cfg.run.seed) for i in GOOD]
    last = result["records"][-1]
    assert last["evaluation_clients"] == len(GOOD)
    assert last["evaluation_samples"] == sum(len(p.y_test) for p in parts)
    model = build_model(cfg.task)
    set_weights(model, decode_arrays((out / "final_model.safetensors").read_bytes()))
    central = evaluate(model, np.concatenate([p.x_test for p in parts]),
                       np.concatenate([p.y_test for p in parts]),
                       norm=PixelNorm(*(np.asarray(v, np.float32)
                                        for v in pixel_norm(cfg.task))))
    assert result["final_accuracy"] == central.accuracy
    assert last["loss"] == pytest.approx(central.loss, rel=1e-5)


def test_the_launched_runs_model_is_what_plain_pytorch_runs(launched, capsys):
    """The run folder holds the model: ``fedcure model evaluate`` and a script that only does
    ``torch.export.load(model.pt2)`` agree on a client's folder; the result and the clients'
    logs name the classes."""
    _, clients, out, _, done = launched
    assert done.returncode == 0, diagnostics(out, done)
    from fedcure_app.cli import main
    from tests.trained.test_model_files import PLAIN

    classes = [str(d) for d in range(10)]
    data = clients / f"client-{GOOD[0]}"
    capsys.readouterr()
    assert main(["model", "evaluate", str(out), "--data", str(data), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    plain = subprocess.run([sys.executable, "-c", PLAIN, str(out), str(data),
                            json.dumps(classes)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert abs(float(plain.stdout) - 100 * got["accuracy"]) < 0.1
    result = json.loads((out / "result.json").read_text())
    assert list(result["class_accuracy_by_name"]) == classes
    log = (out / "logs" / f"client{GOOD[0]}.log").read_text()
    assert "(task, " in log and "label counts {0: " in log
