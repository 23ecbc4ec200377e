"""Namespaces and shaped links, for real (root): made, measured and removed
(:mod:`fedcure_app.testbed.netns`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fedcure_app.devices import PRESETS, parse_profile
from fedcure_app.models import build_model, get_weights
from fedcure_app.testbed import netns
from fedcure_app.testbed.plan import make_plan, run_prefix
from tests.kernel import require_netns

_RECEIVE = """
import socket, sys
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 7000)); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
need, got = int(sys.argv[2]), 0
while got < need:
    chunk = conn.recv(1 << 16)
    if not chunk:
        break
    got += len(chunk)
conn.sendall(b"k"); conn.close()
"""

_SEND = """
import socket, sys, time
payload = open(sys.argv[2], "rb").read()
s = socket.create_connection((sys.argv[1], 7000), timeout=30)
t0 = time.perf_counter()
s.sendall(payload)
s.recv(1)
print(len(payload) * 8 / (time.perf_counter() - t0) / 1e6, flush=True)
"""


def _model_file(tmp_path, dataset: str) -> tuple[str, int]:
    blob = b"".join(np.ascontiguousarray(w).tobytes()
                    for w in get_weights(build_model(dataset, 10)))
    path = tmp_path / f"{dataset}.bin"
    path.write_bytes(blob)
    return str(path), len(blob)


def _transfer_mbps(src_ns: str, dst_ns: str, dst_addr: str, path: str, size: int) -> float:
    rx = subprocess.Popen(netns.in_netns(dst_ns, [sys.executable, "-c", _RECEIVE, dst_addr,
                                                  str(size)]),
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        out = subprocess.run(netns.in_netns(src_ns, [sys.executable, "-c", _SEND, dst_addr,
                                                     path]),
                             capture_output=True, text=True, timeout=60, check=True)
        return float(out.stdout)
    finally:
        rx.wait(10)


@pytest.fixture
def shaped():
    require_netns()
    prefix = run_prefix("tbtest", os.getpid())
    slow = parse_profile({"preset": "rpi4", "uplink_mbps": 10.0, "downlink_mbps": 4.0})
    plan = make_plan(prefix, 1, [slow], None)
    netns.create(plan)
    try:
        yield plan
    finally:
        netns.destroy(prefix)
    assert not [n for n in netns.list_namespaces() if n.startswith(prefix)]


def test_a_10_mbit_uplink_carries_a_model_at_8_to_10_5_mbit(shaped, tmp_path):
    path, size = _model_file(tmp_path, "cifar10")  # 5 MB: about 4 s at 10 Mbit/s
    rate = _transfer_mbps(shaped.clients[0].netns, shaped.cloud.netns, shaped.cloud.address,
                          path, size)
    assert 8.0 <= rate <= 10.5, rate


def test_the_downlink_is_shaped_to_its_own_rate(shaped, tmp_path):
    path, size = _model_file(tmp_path, "mnist")  # 250 kB: about 0.5 s at 4 Mbit/s
    rate = _transfer_mbps(shaped.cloud.netns, shaped.clients[0].netns,
                          shaped.clients[0].address, path, size)
    assert 3.2 <= rate <= 4.2, rate


def test_unshaped_links_are_not_held_to_a_rate(shaped, tmp_path):
    path, size = _model_file(tmp_path, "cifar10")
    rate = _transfer_mbps(shaped.cloud.netns, shaped.edges[0].netns, shaped.edges[0].address,
                          path, size)
    assert rate > 25.0, rate  # 2.5x the fixture's fastest shaped link, even on a loaded host


def test_a_link_set_down_carries_nothing_until_it_is_back(shaped):
    client, cloud = shaped.clients[0], shaped.cloud
    probe = [sys.executable, "-c", "import socket,sys\ntry:\n socket.create_connection("
             f"('{cloud.address}', 9), timeout=1)\nexcept ConnectionRefusedError:\n sys.exit(0)"
             "\nexcept OSError:\n sys.exit(1)"]
    assert subprocess.run(netns.in_netns(client.netns, probe)).returncode == 0
    netns.set_link(shaped, client, up=False)
    assert subprocess.run(netns.in_netns(client.netns, probe)).returncode == 1
    netns.set_link(shaped, client, up=True)
    assert subprocess.run(netns.in_netns(client.netns, probe)).returncode == 0


_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=2)
except ConnectionRefusedError:
    print("reached")
except TimeoutError:
    print("timeout")
except OSError as err:
    print(err.strerror)
"""


def _probe(src, dst) -> str:
    """A TCP connection from ``src`` to ``dst`` within 2 s: ``reached`` (refused counts),
    ``timeout``, or the error."""
    return subprocess.run(netns.in_netns(src.netns, [sys.executable, "-c", _PROBE,
                                                     dst.address]),
                          capture_output=True, text=True).stdout.strip()


def test_a_cut_pair_reaches_nobody_of_the_pair_silently_and_everyone_else_until_it_heals(
        shaped):
    edge, cloud, client = shaped.edges[0], shaped.cloud, shaped.clients[0]
    netns.cut(edge, cloud)
    netns.cut(edge, cloud)  # twice: still one cut
    # silent: the attempt times out, no "no route to host" reaches either side
    assert _probe(edge, cloud) == "timeout" and _probe(cloud, edge) == "timeout"
    assert _probe(edge, client) == "reached" and _probe(cloud, client) == "reached"
    netns.cut(edge, cloud, cut=False)
    assert _probe(edge, cloud) == "reached" and _probe(cloud, edge) == "reached"
    netns.cut(edge, cloud, cut=False)  # healing a healed pair changes nothing


def test_leftovers_of_a_dead_run_are_removed_and_a_live_run_is_kept():
    require_netns()
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = run_prefix("tbtest", os.getpid())
    theirs = run_prefix("tbtest", dead.pid)
    for prefix in (mine, theirs):
        netns.create(make_plan(prefix, 1, [PRESETS["laptop"]], None))
    try:
        assert netns.clean_leftovers("tbtest") == [theirs]
        names = netns.list_namespaces()
        assert not [n for n in names if n.startswith(theirs + "-")]
        assert len([n for n in names if n.startswith(mine + "-")]) == 4
    finally:
        netns.destroy(mine)
        netns.destroy(theirs)
