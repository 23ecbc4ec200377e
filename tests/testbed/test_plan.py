"""The testbed's network plan (:mod:`fedcure_app.testbed.plan`): pure, no root needed."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.devices import PRESETS
from fedcure_app.testbed.plan import (
    IFNAMSIZ,
    SUBNET,
    make_plan,
    owner_pid,
    run_prefix,
    tbf_args,
)


@given(st.integers(1, 20), st.lists(st.sampled_from(sorted(PRESETS)), min_size=1, max_size=300),
       st.integers(1, 9_999_999))
def test_every_node_has_its_own_namespace_interface_and_address(m, names, pid):
    plan = make_plan(run_prefix("tb", pid), m, [PRESETS[n] for n in names], 100.0)
    nodes = plan.nodes()
    assert len(nodes) == 1 + m + len(names)
    assert len({n.netns for n in nodes} | {plan.hub}) == len(nodes) + 1
    assert len({n.peer for n in nodes}) == len(nodes)
    assert all(len(n.peer) <= IFNAMSIZ for n in nodes)
    net = ipaddress.ip_network(f"{SUBNET}.0.0/16")
    addrs = [ipaddress.ip_address(n.address) for n in nodes]
    assert len(set(addrs)) == len(addrs)
    assert all(a in net and a not in (net.network_address, net.broadcast_address) for a in addrs)
    assert all(n.netns.startswith(plan.prefix + "-") for n in nodes)


def test_client_links_carry_their_profile_rates_and_edges_the_edge_link():
    profiles = [PRESETS["rpi4"], PRESETS["laptop"]]
    plan = make_plan("tb1", 2, profiles, 80.0)
    for node, p in zip(plan.clients, profiles):
        assert (node.up_mbps, node.down_mbps) == (p.uplink_mbps, p.downlink_mbps)
    assert all((e.up_mbps, e.down_mbps) == (80.0, 80.0) for e in plan.edges)
    assert (plan.cloud.up_mbps, plan.cloud.down_mbps) == (None, None)


@given(st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.integers(0, 9_999_999))
def test_a_run_prefix_names_its_owner(base, pid):
    prefix = run_prefix(base, pid)
    assert owner_pid(f"{prefix}-c3", base) == pid
    assert owner_pid(f"{prefix}-hub", base + "x") is None


@pytest.mark.parametrize("base", ["", "UPPER", "with-dash", "toolongname"])
def test_bad_prefix_bases_are_refused(base):
    with pytest.raises(ValueError):
        run_prefix(base, 1)


@given(st.floats(0.1, 10_000.0))
def test_tbf_bucket_is_small_but_holds_two_frames(rate):
    args = tbf_args(rate)
    assert args[1] == f"{round(rate * 1e6)}bit"
    burst = int(args[3])
    assert burst >= 2 * 1514
    assert burst <= max(2 * 1514, rate * 1e6 / 8 * 0.004 + 1)
