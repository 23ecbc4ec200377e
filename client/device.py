"""Where ``fedcure-client`` trains: ``--device``/``--gpufreq`` resolved, the device's training
rate measured (:mod:`client.rate`, in a child: this role process never loads torch), and
``--probe``'s report."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

from fedcure_app.errors import UsageError

log = logging.getLogger("fedcure.client")


#: exit code of the CUDA check's child when torch sees no GPU
_NO_CUDA = 3


def device_in_use(device: str) -> str:
    """``cpu`` or ``cuda`` for ``--device`` (``auto``: cuda when torch sees a GPU). The check
    runs torch in a short-lived child, so this role process never loads torch (~150 MB);
    ``cuda`` without a GPU raises :class:`UsageError` (one line)."""
    if device == "cpu":
        return "cpu"
    probe = ("import sys, torch\n"
             "ok = torch.cuda.is_available()\n"
             "print('no GPU visible' if torch.version.cuda else 'a CPU-only torch build', "
             "torch.__version__)\n"
             f"sys.exit(0 if ok else {_NO_CUDA})\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300)
    if res.returncode == 0:
        return "cuda"
    if device == "auto":
        return "cpu"
    why = (res.stdout.strip() or res.stderr.strip().splitlines()[-1:] or ["torch failed"])
    why = why if isinstance(why, str) else why[0]
    raise UsageError(f"--device cuda: CUDA is not available ({why}); use --device cpu or auto")


def gpufreq_in_use(gpufreq: str, profile_name: str) -> str:
    """``devfreq`` or ``off`` for ``--gpufreq`` (``preset``: devfreq on a Jetson profile)."""
    if gpufreq == "preset":
        return "devfreq" if profile_name.lower().startswith("jetson") else "off"
    return gpufreq


def measure_rate(dataset: str, device: str, batch_size: int = 32, timeout_s: float = 300.0
                 ) -> dict[str, Any]:
    """:func:`client.rate.samples_per_s` of the dataset's model on ``device``, run in a child
    (it loads torch, which this process never does): ``{"dataset", "device", "batch_size",
    "samples_per_s"}``. Raises RuntimeError (one line) when the child fails."""
    from client.children import ChildFailed, json_child

    argv = [sys.executable, "-m", "client.rate", "--dataset", dataset, "--device", device,
            "--batch-size", str(int(batch_size))]
    try:
        return json_child(argv, timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"measuring the training rate took over {timeout_s:.0f} s") from None
    except ChildFailed as err:
        raise RuntimeError(f"measuring the training rate failed: {err.tail}") from None


def probe(cpu_root: str | None = None, dataset: str | None = None, device: str = "cpu",
          batch_size: int = 32) -> int:
    """``--probe``: print this machine's device profile as JSON; with ``--dataset``, or with a
    ``--device`` other than cpu, also ``training``: the measured samples/s of the dataset's model
    (default digits) on the device in use, the rate a ``--device cuda`` client registers."""
    from fedcure_app.devices import DEFAULT_CPU_ROOT, probe_device

    info = probe_device(cpu_root or DEFAULT_CPU_ROOT)
    if dataset or device != "cpu":
        used = device_in_use(device)
        info["training"] = measure_rate(dataset or "digits", used, batch_size)
    print(json.dumps(info, indent=1, default=str))
    return 0
