"""What ``flwr run`` prints on FedCure's side: Ray's FutureWarning about accelerator variables
(raised by ``ray.init`` in the ServerApp's process) is silenced once the ServerApp is loaded;
any other FutureWarning still shows."""

from __future__ import annotations

import subprocess
import sys

RAY_TIP = ("Tip: In future versions of Ray, Ray will no longer override accelerator visible "
           "devices env var if num_gpus=0 or num_gpus=None (default).")


def _warn(message: str) -> str:
    code = ("import warnings, fedcure_app.flower.server_app\n"
            f"warnings.warn({message!r}, FutureWarning)\n")
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_rays_accelerator_tip_is_silenced_once_the_serverapp_is_loaded():
    assert "FutureWarning" not in _warn(RAY_TIP)


def test_other_future_warnings_still_show():
    assert "FutureWarning: something else" in _warn("something else")
