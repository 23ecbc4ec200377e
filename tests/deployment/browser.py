"""A real headless Chromium driven over the DevTools protocol (tests of the live view).

:class:`Chromium` starts Debian's ``chromium`` with a private profile and a DevTools port,
opens one page, evaluates JavaScript in it and takes screenshots; :meth:`Chromium.close` stops
the process group it started. Needs the ``chromium`` binary (``.ci/run`` installs it) and the
``websockets`` package (test extra).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest


def chromium_binary() -> str:
    """The chromium command; skips the test where it is missing, unless the CI asks for the
    live-view tests (``FEDCURE_LIVE_TESTS=1``), where that is a failure."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("FEDCURE_LIVE_TESTS") == "1":
        pytest.fail("chromium is not installed (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install chromium)")


class Chromium:
    """One headless Chromium with one page (see the module docstring)."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1500) -> None:
        from websockets.sync.client import connect

        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--disable-extensions", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + 60
        while not port_file.is_file() or len(port_file.read_text().split()) < 2:
            if self.proc.poll() is not None or time.monotonic() > end:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        self._conn = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20)
        self.ws = self._conn.__enter__()
        self._id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events in between are skipped)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """The first value of ``expression`` that is not null, polled every 0.2 s (None when
        it stayed null for ``timeout_s`` seconds)."""
        shown, end = None, time.monotonic() + timeout_s
        while shown is None and time.monotonic() < end:
            time.sleep(0.2)
            shown = self.evaluate(expression)
        return shown

    def viewport(self, width: int, height: int) -> None:
        """Lay the page out as in a ``width`` × ``height`` window (CSS pixels)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.__exit__(None, None, None)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
