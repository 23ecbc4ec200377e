"""The deployed client's footprint pins (imports only where used) and its --device/--gpufreq
options (:mod:`client.cli`, :mod:`fedcure_app.flower.client_app`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedcure_app.config import ConfigError, WarmClientConfig

ROOT = Path(__file__).resolve().parents[2]


def _loaded(code: str) -> dict[str, bool]:
    """Which heavy packages a fresh interpreter has loaded after running ``code``."""
    probe = code + ("\nimport sys, json\nprint(json.dumps({m: m in sys.modules for m in "
                    "('torch', 'scipy', 'sympy', 'flwr', 'sklearn')}))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_relay_processes_load_neither_torch_nor_scipy() -> None:
    """The role, the SuperNode and the executor only relay: no torch, no scipy."""
    got = _loaded("import client.cli, client.supernode, client.executor\n"
                  "from fedcure_app.federation import partition_for, profiles_for\n"
                  "from fedcure_app.data import load_dataset\n"
                  "import fedcure_app.flower.node_data, fedcure_app.protocol.codec")
    assert not got["torch"] and not got["scipy"] and not got["sklearn"]


def test_the_client_role_loads_no_numpy(tmp_path: Path) -> None:
    """The long-lived role relays: it registers its profile and watches its children without
    NumPy (its partition is cut in a child process, :mod:`client.partition`)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys\nsys.modules['numpy'] = None  # any import of NumPy fails\n"
            "import client.cli, client.partition, client.association, client.children\n"
            "import client.device, client.executor, client.wake\n"
            "import fedcure_app.flower.node_data, fedcure_app.runtime.processes\n"
            "import fedcure_app.protocol.channel, fedcure_app.protocol.cloud_pb2_grpc\n"
            "import fedcure_app.protocol.profiles, fedcure_app.config\n"
            "from fedcure_app.devices import make_actuator, parse_profile, remove_cgroups\n"
            "from fedcure_app.flower.node_data import read_applied\n"
            "print('ok')\n"
            # and the role itself, until it finds no cloud (port 9 is closed)
            "from client.cli import main\n"
            "sys.exit(main(['--cloud', '127.0.0.1:9', '--insecure', '--connect-timeout', '0.5',"
            " '--name', 'n', '--work-dir', sys.argv[1]]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "work")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
    assert out.returncode == 1 and "cannot reach the cloud" in out.stderr, out.stderr[-2000:]


def test_trainer_loads_no_scipy_and_training_loads_no_compiler_stack() -> None:
    """The trainer's ClientApp needs torch and flwr only; a training step (plain SGD) does not
    pull torch.optim's compiler stack (sympy)."""
    got = _loaded("import fedcure_app.flower.client_app, torch\n"
                  "from fedcure_app.models import build_model\n"
                  "from fedcure_app.training import train_local\n"
                  "m = build_model('digits', 10)\n"
                  "train_local(m, torch.rand(40, 1, 8, 8), torch.randint(0, 10, (40,)), "
                  "steps=2, lr=0.01)")
    assert got["torch"] and got["flwr"]
    assert not got["scipy"] and not got["sympy"]


def test_device_and_gpufreq_are_checked_by_the_schema() -> None:
    cfg = WarmClientConfig.from_env({"FEDCURE_DEVICE": "auto"})
    assert (cfg.device, cfg.gpufreq) == ("auto", "preset")
    with pytest.raises(ConfigError):
        WarmClientConfig.from_env({"FEDCURE_DEVICE": "gpu"})
    with pytest.raises(ConfigError):
        WarmClientConfig.from_env({}, gpufreq="nvpmodel")


def test_gpufreq_preset_means_devfreq_on_a_jetson_only() -> None:
    from client.cli import gpufreq_in_use

    assert gpufreq_in_use("preset", "jetson-orin-nano") == "devfreq"
    assert gpufreq_in_use("preset", "rpi4") == "off"
    assert gpufreq_in_use("off", "jetson-nano") == "off"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line_and_exit_2_while_auto_falls_back() -> None:
    from client.cli import device_in_use

    assert device_in_use("auto") == "cpu"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "client.cli", "--cloud", "127.0.0.1:9",
                          "--insecure", "--device", "cuda"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda: CUDA is not available" in lines[0]


def test_help_shows_device_with_cuda() -> None:
    from client.cli import build_parser

    text = build_parser().format_help()
    assert "--device {cpu,cuda,auto}" in text and "--gpufreq" in text


def test_the_training_rate_on_the_cpu_is_positive() -> None:
    """The rate ``--probe`` reports (and a cuda client registers): the trainer's own steps on
    the dataset's model, here on the CPU."""
    from client.rate import samples_per_s

    assert samples_per_s("digits", "cpu", batch_size=8, min_seconds=0.05) > 0


def test_probe_with_a_dataset_reports_the_measured_rate() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "client.cli", "--probe", "--dataset", "digits"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    training = json.loads(res.stdout)["training"]
    assert training["device"] == "cpu" and training["dataset"] == "digits"
    assert training["samples_per_s"] > 0


def test_register_carries_the_device_in_use_and_its_rate() -> None:
    """Register sends where the client trains and its measured rate (the cloud lists both in
    result.json and takes the rate for the latency prior)."""
    import argparse
    import threading
    from concurrent.futures import Future

    import numpy as np

    from client.association import register
    from fedcure_app.devices import PRESETS
    from fedcure_app.flower.node_data import NodeData

    sent = []

    class Stub:
        class Register:  # noqa: D106 - grpc's unary-unary callable, its .future only
            @staticmethod
            def future(req, timeout, wait_for_ready):
                sent.append(req)
                fut: Future = Future()
                fut.set_result("ok")
                return fut

    data = NodeData(x=np.zeros((2, 1, 8, 8), np.uint8), y=np.array([0, 1]), dataset="digits",
                    num_classes=10, client_name="g", partition_id=0, profile=PRESETS["rpi4"])
    args = argparse.Namespace(token="", register_timeout=5.0, cloud="x:1",
                              device_in_use="cuda", samples_per_s=1234.5)
    assert register(Stub, args, "g", data, 0, threading.Event()) == "ok"
    assert (sent[0].compute_device, sent[0].samples_per_s) == ("cuda", 1234.5)
