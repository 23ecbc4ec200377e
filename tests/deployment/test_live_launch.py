"""End to end: a real `fedcure launch` with its live view on, watched by a real Prometheus
(Debian's ``prometheus``, scraping /metrics every second) and a real headless Chromium (the
page, updated by its event stream), both checked against the cloud's Monitor.Status.

``.ci/run`` installs both binaries and sets FEDCURE_LIVE_TESTS=1 (missing ones then fail);
elsewhere a missing binary skips the test that needs it. The browser's screenshot is left in
the launch's output folder as ``live-view.png``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from fedcure_app.runtime.processes import free_ports
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from tests.deployment.browser import Chromium
from tests.deployment.fakes import channel

EDGES, CLIENTS, ROUNDS = 2, 4, 24


def binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("FEDCURE_LIVE_TESTS") == "1":
        pytest.fail(f"{name} is not installed (apt-get install {name})")
    pytest.skip(f"{name} is not installed (apt-get install {name})")


@dataclass
class Launched:
    out: Path
    proc: subprocess.Popen
    cloud: str
    dashboard: str
    prometheus: str | None
    log: Path

    def status(self) -> pb.StatusReply:
        ch = channel(self.cloud)
        try:
            return pb_grpc.MonitorStub(ch).Status(pb.StatusRequest(), timeout=5)
        finally:
            ch.close()

    def diagnostics(self) -> str:
        parts = [self.log.read_text()[-2000:]]
        for log in sorted((self.out / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n" + log.read_text()[-1200:])
        return "\n".join(parts)


def _start_prometheus(tmp: Path, port: int, target: str) -> subprocess.Popen | None:
    if shutil.which("prometheus") is None and os.environ.get("FEDCURE_LIVE_TESTS") != "1":
        return None
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: fedcure\n    static_configs:\n"
        f"      - targets: ['{target}']\n")
    return subprocess.Popen(
        [binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"),
        start_new_session=True)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live-launch")
    out = tmp / "run"
    dash_port, prom_port = free_ports(2)
    prom = _start_prometheus(tmp, prom_port, f"127.0.0.1:{dash_port}")
    log = tmp / "launch.log"
    argv = [sys.executable, "-m", "fedcure_app.cli", "launch", "--edges", str(EDGES),
            "--clients", str(CLIENTS), "--rounds", str(ROUNDS), "--dataset", "digits",
            "--tau-e", "6", "--tau-c", "25", "--eval-every", "1", "--timeout", "540",
            "--no-progress", "--out", str(out), "--dashboard", f"127.0.0.1:{dash_port}"]
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    cloud = None
    end = time.monotonic() + 120
    while cloud is None and time.monotonic() < end and proc.poll() is None:
        found = re.search(r"cloud (127\.0\.0\.1:\d+)", log.read_text())
        cloud = found.group(1) if found else None
        time.sleep(0.2)
    run = Launched(out, proc, cloud or "", f"http://127.0.0.1:{dash_port}/",
                   f"http://127.0.0.1:{prom_port}" if prom is not None else None, log)
    try:
        assert cloud is not None, run.diagnostics()
        yield run
    finally:
        try:
            proc.wait(600)
        except subprocess.TimeoutExpired:
            _stop(proc)
        _stop(prom)


def test_prometheus_scrapes_the_cloud_and_promql_sees_the_global_version(launched):
    if launched.prometheus is None:
        binary("prometheus")
    query = urllib.parse.urlencode({"query": "max_over_time(fedcure_global_version[10m])"})
    value = None
    end = time.monotonic() + 300
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{launched.prometheus}/api/v1/query?{query}",
                                        timeout=5) as r:
                got = json.loads(r.read())
            if got["status"] == "success" and got["data"]["result"]:
                value = float(got["data"]["result"][0]["value"][1])
                if value > 0:
                    break
        except OSError:
            pass
        assert launched.proc.poll() is None or value, launched.diagnostics()
        time.sleep(1)
    assert value is not None and value > 0, launched.diagnostics()
    # the scrape carries the documented per-coalition series
    q = urllib.parse.urlencode({"query": "count(fedcure_virtual_queue)"})
    with urllib.request.urlopen(f"{launched.prometheus}/api/v1/query?{q}", timeout=5) as r:
        assert float(json.loads(r.read())["data"]["result"][0]["value"][1]) == EDGES


#: what the page shows, read from its DOM
PAGE = """(document.readyState !== 'complete' || !document.body
            || !document.getElementById('version')) ? null : ({
  round: document.body.dataset.round === undefined ? null : +document.body.dataset.round,
  version: document.getElementById('version').textContent,
  phase: document.body.dataset.phase || null,
  rows: [...document.querySelectorAll('#coalitions tbody tr')].map(tr => ({
    coalition: +tr.dataset.coalition, state: tr.dataset.state,
    members: tr.querySelector('.members').textContent,
    waiting: tr.querySelector('.waiting').textContent})),
  clients: document.querySelectorAll('#clients-table tbody tr').length,
  charts: [...document.querySelectorAll('svg.chart')].map(s => s.childElementCount)
})"""


def _ids(labels: str) -> str:
    """The client ids of a list the page shows (``NAME (#ID), …``), as Monitor.Status lists
    them (``ID, …``)."""
    return ", ".join(re.findall(r"\(#(\d+)\)", labels))


def _progress(s: pb.StatusReply) -> list[tuple]:
    return [(p.coalition, p.edge_round, tuple(p.training_client_ids)) for p in s.progress]


def _key(s: pb.StatusReply) -> tuple:
    return s.phase, s.round, s.version, tuple(s.in_flight)


#: the page's event interval and a margin (s): what the page shows may be this old
PAGE_LAG_S = 2.0


def _steady_waiting(seen: list[tuple[float, dict[int, str]]], coalition: int,
                    now: float) -> str | None:
    """The clients ``coalition`` waited for throughout the last :data:`PAGE_LAG_S` seconds by
    every Monitor.Status answer in them and the last one before (no older than twice that);
    None when they changed or no answer brackets the window (polls slowed by load)."""
    before = [(t, w) for t, w in seen if t <= now - PAGE_LAG_S]
    if not before or now - before[-1][0] > 2 * PAGE_LAG_S:
        return None
    window = [before[-1][1], *(w for t, w in seen if t > now - PAGE_LAG_S)]
    values = {w.get(coalition) for w in window}
    return values.pop() if len(values) == 1 else None


def test_the_page_in_chromium_follows_the_run_as_monitor_status_reports_it(launched,
                                                                           tmp_path):
    """The page is compared with Monitor.Status whenever the two agree on the round and the
    cloud did not move while the page was read: the same round, version and coalitions
    training; and, where the edges' progress had not changed for the event interval and a
    margin (:data:`PAGE_LAG_S`), the clients each coalition waits for. Until the page has shown
    two rounds."""
    browser = Chromium(tmp_path / "profile")
    checked: list[int] = []
    waits = 0
    page = None
    #: (time, waiting list per coalition) of every Monitor.Status answer
    seen: list[tuple[float, dict[int, str]]] = []
    try:
        browser.open(launched.dashboard)
        end = time.monotonic() + 400
        while time.monotonic() < end and len(set(checked)) < 3:
            if launched.proc.poll() is not None:
                break
            try:
                before = launched.status()
                shown = browser.evaluate(PAGE)
                after = launched.status()
            except grpc.RpcError:
                break  # the cloud is gone: the run ended
            if shown is None:  # still loading (slow on a busy machine)
                time.sleep(0.2)
                continue
            page = shown
            now = time.monotonic()
            for s in (before, after):
                seen.append((now, {p.coalition: ", ".join(str(c) for c in p.training_client_ids)
                                   for p in s.progress}))
            time.sleep(0.1)
            if (_key(before) != _key(after) or after.phase != pb.StatusReply.TRAINING
                    or page["round"] != after.round or page["phase"] != "training"):
                # the cloud moved while we looked, or the page (one event a second) is
                # catching up: round 0 is both "registering" and "training"
                continue
            assert int(page["version"]) == after.version
            assert [r["coalition"] for r in page["rows"]] == list(range(EDGES))
            training = {r["coalition"] for r in page["rows"] if r["state"] == "training"}
            assert training == set(after.in_flight), (page, after)
            # the clients a coalition waits for, where Monitor.Status said the same for longer
            # than the page can lag behind it
            for r in page["rows"]:
                if r["state"] == "training" and r["waiting"]:
                    steady = _steady_waiting(seen, r["coalition"], now)
                    if steady is not None:
                        assert _ids(r["waiting"]) == steady, (r, steady)
                        waits += 1
            if checked and after.round > checked[0] and not (
                    launched.out / "live-view.png").exists():
                browser.screenshot(launched.out / "live-view.png")
            if not checked or checked[-1] != after.round:
                checked.append(after.round)
        assert len(set(checked)) >= 2, (
            f"the page never showed two rounds checked against Monitor.Status: {checked}, "
            f"last page {page}\n{launched.diagnostics()}")
        assert page["clients"] == CLIENTS and all(n > 2 for n in page["charts"]), page
    finally:
        browser.close()
    print(f"checked rounds {checked}, waiting lists checked {waits} times")
    png = launched.out / "live-view.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    members = [r["members"] for r in page["rows"]]
    launched.proc.wait(600)
    assert launched.proc.returncode == 0, launched.diagnostics()
    result = json.loads((launched.out / "result.json").read_text())
    # each member by the name it registered with (result.json's) and its id
    names = {c["id"]: c["name"] for c in result["clients"]}
    assert members == [", ".join(f"{names[c]}\u00a0(#{c})" for c in co)
                       for co in result["coalitions"]]
    record = json.loads((launched.out / "launch.json").read_text())
    assert record["dashboard"] == launched.dashboard
