"""Partitions on real links (root; ``fedcure testbed``'s namespaces): one federation (a cloud,
2 edges, 2 clients each, both coalitions training at once) goes through, in order:

1. edge 0 cut from the cloud mid-task, its clients still reachable: (a) healed before the
   task's deadline: its result arrives once, on time; (b) healed after it: the task expires,
   the late result is aggregated as a stale update (the late-answer rule, docs/security.md)
   and the coalition is dispatched again;
2. the cloud cut from every edge for 20 s: the edges go on by themselves;
3. a client's link flapping (11 s down, 3 s up, for 30 s): its edge's rounds go on within the
   edge timeout, it is dropped and rejoins, nothing counted twice;
4. the cloud SIGKILLed while edge 0 is cut from it, restarted from its checkpoint, the cut
   healed: edge 0's result is taken exactly once or asked for again, never lost silently.

Each scenario measures the time from healing to the next aggregation of the coalition it
hurt (printed; ``-s`` shows it) and checks the history so far (tests/deployment/invariants.py:
versions 1..N, one aggregation per task, every update an edge was told was accepted is in
it); the last test stops the cloud and checks the final history, the final model, each
client's applied edge rounds, and that no namespace, cgroup or process is left. The tests
depend on running in this order (pytest's default) on the one federation.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from datetime import datetime

import pytest

from fedcure_app.flower.fastpath.held_pulls import DEFAULT_REPLY_HOLD_S
from fedcure_app.flower.node_data import read_applied
from fedcure_app.testbed import netns
from tests.deployment.invariants import lost_updates, same_model, version_problems
from tests.kernel import require_netns
from tests.testbed.federation import Federation, say

#: edges, clients (2 per edge), edge rounds per task, local steps per edge round
EDGES, CLIENTS, TAU_E, TAU_C = 2, 4, 2, 5
#: seconds: per edge round reply deadline; shortest task deadline (the estimate's 99 % quantile
#: with slack 1 decides above it)
EDGE_TIMEOUT, DEADLINE_MIN = 5.0, 15.0
#: seconds: the short cut of 1a; how long 1b stays cut past the deadline; scenario 2's cut;
#: scenario 3's flapping (up time, duration)
SHORT_CUT, PAST_DEADLINE, CLOUD_CUT, FLAP, FLAPPING = 4.0, 3.0, 20.0, 3.0, 30.0
#: seconds: scenario 3's down time, past the edge timeout and the two reply holds a reply may
#: land within (fedcure_app.flower.edge), so that an edge round the client is in while its link
#: is down always drops it (a shorter down time drops it only when TCP's retransmission backoff
#: or the round's timing happens to carry the reply past them)
FLAP_DOWN = EDGE_TIMEOUT + 2 * DEFAULT_REPLY_HOLD_S + 2.0
#: the longest wait for anything (a loaded CI host)
PATIENCE = 120.0
WARM = 10
#: seconds: the longest the test keeps a coalition's clients paused to cut its edge mid-task
#: (well within EDGE_TIMEOUT, so that no edge round drops them)
PAUSE_S = 1.5
#: seconds: the oldest task the test cuts an edge in (since the cloud dispatched it): a task its
#: edge got late (its link to the cloud had stalled and reconnected) is near its deadline
FRESH_S = DEADLINE_MIN / 3

CONFIG = f"""
[reliability]
deadline-slack = 1.0
first-deadline-s = 90.0
deadline-min-s = {DEADLINE_MIN}
"""


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    require_netns()
    out = tmp_path_factory.mktemp("partitions")
    config = out / "partitions.toml"
    config.write_text(CONFIG)
    f = Federation(out / "run", [
        "--edges", str(EDGES), "--clients", str(CLIENTS), "--rounds", "100000",
        "--dataset", "digits", "--partition", "iid", "--formation", "none",
        "--tau-e", str(TAU_E), "--tau-c", str(TAU_C), "--lr", "0.05", "--eval-every", "100000",
        "--max-concurrent", str(EDGES), "--edge-timeout", str(EDGE_TIMEOUT),
        "--deadline-min", str(DEADLINE_MIN), "--config", str(config), "--cpufreq", "off",
        "--register-timeout", "300", "--no-progress"])
    try:
        f.start()
        # warm: every coalition answered WARM tasks (start-up is over, and the latency
        # estimator has seen enough that a task's deadline is near DEADLINE_MIN: with a few
        # scattered latencies its 0.99 quantile, and the deadline with it, is minutes)
        f.wait(f"each coalition's first {WARM} aggregations",
               lambda: all(n >= WARM for n in _arrived(f).values()), 3 * PATIENCE)
        yield f
    finally:
        say(f"recovery (heal -> next aggregation), s: {json.dumps(f.recovery)}")
        (out / "recovery.json").write_text(json.dumps(f.recovery, indent=1))
        pids = list(f.record.get("pids", {}).values())
        f.close()
        prefix = f.prefix if f.site is not None else None
    if prefix:
        assert not [n for n in netns.list_namespaces() if n.startswith(prefix)]
        assert not _cgroups(prefix)
    from fedcure_app.runtime.processes import alive

    assert not [p for p in pids if alive(p)]


def _arrived(fed: Federation) -> dict[int, int]:
    """How many aggregations of each coalition the cloud has logged."""
    counts = Counter(a.coalition for a in fed.arrivals())
    return {m: counts[m] for m in range(EDGES)}


def _deadline_s(fed: Federation, task: str) -> float:
    """The deadline (seconds) the cloud logged for ``task`` when it dispatched it."""
    m = re.search(rf"task {re.escape(task)} -> edge \d+ \(.*, deadline ([0-9.]+) s\)",
                  fed.log("cloud"))
    assert m is not None, f"the cloud logged no deadline for {task}"
    return float(m.group(1))


def _cgroups(prefix: str) -> list[str]:
    from fedcure_app.devices.cgroup import CgroupError, find_cpu_controller

    try:
        return [d.name for d in find_cpu_controller().base.glob(f"{prefix}-*")]
    except CgroupError:
        return []


def _state(fed: Federation) -> dict:
    """The cloud's last checkpoint (records and faults so far)."""
    return json.loads((fed.out / "checkpoint" / "state.json").read_text())


def _told(fed: Federation) -> list[tuple[str, int]]:
    """(task, round) of every answer an edge was told was aggregated."""
    return [(t, int(m.group(1))) for e in range(EDGES) for t, reply in fed.answered(e)
            if (m := re.match(r"aggregated as round (\d+)", reply))]


def _check_history(fed: Federation) -> dict:
    state = _state(fed)
    records = state["records"]
    assert version_problems(records) == []
    assert lost_updates(records, _told(fed), key="round") == []
    fed.check_alive()
    return state


def _dispatch_age_s(fed: Federation, task: str) -> float:
    """Seconds since the cloud logged dispatching ``task`` (its log's clock, to the second)."""
    m = re.search(rf"(\d\d):(\d\d):(\d\d) \S+ fedcure\.cloud: round \d+: task "
                  rf"{re.escape(task)} -> ", fed.log("cloud"))
    assert m is not None, f"the cloud logged no dispatch of {task}"
    now = datetime.now()
    at = now.replace(hour=int(m[1]), minute=int(m[2]), second=int(m[3]), microsecond=0)
    return (now - at).total_seconds() % 86_400


def _serving(fed: Federation, edge: int) -> str | None:
    """The task edge ``edge`` serves now (the last one it logged taking and has not
    answered), or None."""
    tasks = re.findall(rf"edge {edge}: task (\S+) \(", fed.log(f"edge{edge}"))
    if not tasks or tasks[-1] in {t for t, _ in fed.answered(edge)}:
        return None
    return tasks[-1]


def _cut_mid_task(fed: Federation, edge: int) -> str:
    """Cut edge ``edge`` from the cloud while it serves a task; the task's id.

    Its clients are paused (:meth:`Federation.paused`) while the test finds the task and cuts,
    so that the task cannot end first however fast its edge rounds are (a few tens of ms); they
    go on within the edge timeout, and the edge finishes the task while cut. A task whose answer
    got through just before the cut (the edge heard the reply, or the cloud aggregated it and the
    reply was lost in the cut) does not count: healed, and a later one is taken; nor does a
    task the cloud dispatched more than :data:`FRESH_S` ago (its edge got it late)."""
    node, cloud = fed.plan.edges[edge], fed.plan.cloud
    clients = [i for i, m in enumerate(_state(fed)["assignment"]) if m == edge]
    tries: Counter[str] = Counter()
    #: tasks found answered after a cut: not cut in again (the edge is still resending its
    #: answer; cutting it again and again would hold its connection down until its keepalive
    #: gives up)
    passed: set[str] = set()

    def fresh() -> str | None:
        task = _serving(fed, edge)
        if task is None or task in passed:
            return None
        if _dispatch_age_s(fed, task) > FRESH_S:
            passed.add(task)
            tries[f"tasks dispatched over {FRESH_S:.0f} s before"] += 1
            return None
        return task

    give_up = time.monotonic() + PATIENCE
    while time.monotonic() < give_up:
        found: list[str] = []
        with fed.paused(clients):
            end = time.monotonic() + PAUSE_S
            while time.monotonic() < end and not found:
                task = fresh()
                if task is not None:
                    netns.cut(node, cloud)
                    found.append(task)
                else:
                    time.sleep(0.05)
        if not found:  # no new task while its clients were paused (a loaded host)
            tries["pauses without a new task"] += 1
            time.sleep(0.5)
            continue
        time.sleep(1.0)
        if (found[0] not in {t for t, _ in fed.answered(edge)}
                and _record(_state(fed), found[0]) is None):
            return found[0]
        tries["tasks answered before the cut"] += 1
        passed.add(found[0])
        netns.cut(node, cloud, cut=False)
    raise AssertionError(f"edge {edge} could not be cut mid-task in {PATIENCE:.0f} s: "
                         f"{dict(tries)}; progress: {fed.progress()}")


def _lost(fed: Federation, coalition: int) -> int:
    """How often the cloud has marked ``coalition`` lost so far."""
    return sum(f["kind"] == "lost" and f["coalition"] == coalition
               for f in _state(fed)["faults"])


def _record(state: dict, task: str) -> dict | None:
    return next((r for r in state["records"] if r["task_id"] == task), None)


def test_1a_an_edge_cut_from_the_cloud_and_back_before_the_deadline_is_aggregated_once(fed):
    edge, cloud = fed.plan.edges[0], fed.plan.cloud
    task = _cut_mid_task(fed, 0)
    say(f"1a: edge 0 cut from the cloud in task {task}; progress: {fed.progress()}")
    time.sleep(SHORT_CUT)
    say(f"1a: after {SHORT_CUT:.0f} s: {fed.progress()}")
    seen = len(fed.arrivals())
    netns.cut(edge, cloud, cut=False)
    healed = time.monotonic()
    at, arrival = fed.wait_arrival("edge 0's result after the heal", seen, PATIENCE,
                                   lambda a: a.coalition == 0)
    fed.recovery["1a edge cut < deadline"] = round(at - healed, 2)
    say(f"1a: healed; coalition 0 aggregated {at - healed:.2f} s later; {fed.progress()}")
    state = _check_history(fed)
    rec = _record(state, task)
    assert rec is not None and not rec["late"], rec  # once, on time
    # the edge logs the cloud's reply after the cloud logs the aggregation
    fed.wait(f"edge 0 to log the reply to {task}",
             lambda: task in {t for t, _ in fed.answered(0)}, 30.0)
    assert [t for t, _ in fed.answered(0)].count(task) == 1


def test_1b_an_edge_cut_past_its_deadline_expires_and_its_late_result_follows_the_rule(fed):
    edge, cloud = fed.plan.edges[0], fed.plan.cloud
    lost_before = _lost(fed, 0)
    task = _cut_mid_task(fed, 0)
    cut_at = time.monotonic()
    deadline = _deadline_s(fed, task)
    say(f"1b: edge 0 cut from the cloud in task {task} (deadline {deadline:.1f} s)")
    fed.wait("the task's deadline", lambda: _lost(fed, 0) > lost_before, deadline + PATIENCE)
    say(f"1b: coalition 0 lost {time.monotonic() - cut_at:.1f} s after the cut; "
        f"progress: {fed.progress()}")
    time.sleep(PAST_DEADLINE)
    seen = len(fed.arrivals())
    netns.cut(edge, cloud, cut=False)
    healed = time.monotonic()
    at, arrival = fed.wait_arrival("coalition 0's late result or its next task", seen,
                                   PATIENCE, lambda a: a.coalition == 0)
    fed.recovery["1b edge cut > deadline"] = round(at - healed, 2)
    say(f"1b: healed {time.monotonic() - cut_at:.1f} s after the cut; coalition 0 "
        f"aggregated {at - healed:.2f} s later (late={arrival.late}); {fed.progress()}")
    # dispatched again: a task of coalition 0 that is not the expired one is aggregated
    fed.wait("coalition 0 dispatched again and aggregated",
             lambda: any(r["coalition"] == 0 and r["task_id"] != task
                         for r in _state(fed)["records"][arrival.round - 1:]), PATIENCE)
    state = _check_history(fed)
    rec = _record(state, task)
    replies = [reply for t, reply in fed.answered(0) if t == task]
    # the late-answer rule: within the staleness bound it is a late, stale update; beyond it
    # it is refused; either way the edge hears it once and it is never aggregated twice
    refused = f"the cloud did not take task {task} (FAILED_PRECONDITION" in fed.log("edge0")
    if rec is not None:
        assert rec["late"] and replies and "late" in replies[0], (rec, replies)
    else:
        assert refused, f"the late result of {task} never reached the cloud"
    assert len(replies) <= 1, replies


def test_2_the_cloud_cut_from_every_edge_for_20_s_and_back_trains_on(fed):
    cloud = fed.plan.cloud
    for edge in fed.plan.edges:
        netns.cut(cloud, edge)
    say(f"2: the cloud cut from every edge; progress: {fed.progress()}")
    time.sleep(CLOUD_CUT / 2)
    say(f"2: {CLOUD_CUT / 2:.0f} s in: {fed.progress()}")
    time.sleep(CLOUD_CUT / 2)
    fed.check_alive()
    seen = len(fed.arrivals())
    for edge in fed.plan.edges:
        netns.cut(cloud, edge, cut=False)
    healed = time.monotonic()
    at, _ = fed.wait_arrival("an aggregation after the heal", seen, PATIENCE)
    fed.recovery["2 cloud cut 20 s"] = round(at - healed, 2)
    for m in range(EDGES):  # every edge is back by itself
        fed.wait_arrival(f"coalition {m} after the heal", seen, PATIENCE,
                         lambda a, m=m: a.coalition == m)
    say(f"2: healed; first aggregation {at - healed:.2f} s later; {fed.progress()}")
    _check_history(fed)


def test_3_a_flapping_client_is_dropped_rejoins_and_nothing_is_counted_twice(fed):
    state = _state(fed)
    victim = next(i for i, m in enumerate(state["assignment"]) if m == 0)
    node = fed.plan.clients[victim]
    seen = len(fed.arrivals())
    end = time.monotonic() + FLAPPING
    say(f"3: client {victim} (coalition 0) flapping ({FLAP_DOWN:.0f} s down, {FLAP:.0f} s up) "
        f"for {FLAPPING:.0f} s")
    try:
        while time.monotonic() < end:
            netns.set_link(fed.plan, node, up=False)
            time.sleep(FLAP_DOWN)
            netns.set_link(fed.plan, node, up=True)
            time.sleep(FLAP)
            fed.check_alive()
    finally:
        netns.set_link(fed.plan, node, up=True)
    healed = time.monotonic()
    stopped = len(fed.arrivals())
    during = [a for a in fed.arrivals()[seen:] if a.coalition == 0]
    say(f"3: {len(during)} aggregations of coalition 0 while flapping; {fed.progress()}")
    # the edge rounds went on: coalition 0 kept being aggregated while its client flapped
    assert during, "coalition 0 was not aggregated while its client flapped"
    flapped = {r["task_id"] for r in _state(fed)["records"][seen:] if r["coalition"] == 0}
    dropped = [r["task_id"] for r in _state(fed)["records"][seen:]
               if victim in r["dropped"]]
    say(f"3: the client was dropped from {len(dropped)} of {len(flapped)} tasks")
    assert dropped, "the flapping client was never dropped"
    # it rejoins: a task after the flapping that it trained every edge round of
    data_file = fed.out / "work" / f"client{victim}" / "node-data.npz"
    after = len(fed.arrivals())
    holder: list[dict] = []

    def rejoined() -> bool:
        applied = read_applied(data_file)
        for r in _state(fed)["records"][after:]:
            rounds = sorted(a["edge_round"] for a in applied if a["task"] == r["task_id"])
            if r["coalition"] == 0 and victim not in r["dropped"] and rounds == list(
                    range(TAU_E)):
                holder.append(r)
                return True
        return False

    at, _ = fed.wait_arrival("coalition 0 after the flapping", stopped, PATIENCE,
                             lambda a: a.coalition == 0)
    fed.recovery["3 client flapping 30 s"] = round(at - healed, 2)
    at = fed.wait("the flapping client to train a whole task again", rejoined, PATIENCE)
    say(f"3: the client trained a whole task again {at - healed:.2f} s after the flapping")
    applied = read_applied(data_file)
    rerun = set(re.findall(r"task (\S+) \(coalition \d+\): no client answered",
                           fed.log("edge0")))
    twice = [k for k, n in Counter((a["task"], a["edge_round"]) for a in applied).items()
             if n > 1 and k[0] not in rerun]
    assert twice == []
    _check_history(fed)


def test_4_the_cloud_killed_while_an_edge_is_cut_resumes_and_takes_its_result_once(fed):
    edge, cloud = fed.plan.edges[0], fed.plan.cloud
    task = _cut_mid_task(fed, 0)
    say(f"4: edge 0 cut from the cloud in task {task}")
    # the edge finishes the task while cut (its clients are reachable)
    time.sleep(SHORT_CUT)
    fed.kill_cloud()
    say(f"4: cloud SIGKILLed; progress: {fed.progress()}")
    fed.restart_cloud()
    seen = len(fed.arrivals())
    # the resumed cloud trains on with the edge it reaches
    fed.wait_arrival("the resumed cloud's first aggregation", seen, PATIENCE,
                     lambda a: a.coalition == 1)
    say(f"4: cloud resumed and aggregating; progress: {fed.progress()}")
    seen = len(fed.arrivals())
    netns.cut(edge, cloud, cut=False)
    healed = time.monotonic()
    at, arrival = fed.wait_arrival("coalition 0 after the heal", seen, PATIENCE,
                                   lambda a: a.coalition == 0)
    fed.recovery["4 cloud killed during an edge cut"] = round(at - healed, 2)
    say(f"4: healed; coalition 0 aggregated {at - healed:.2f} s later "
        f"(late={arrival.late}); {fed.progress()}")
    state = _check_history(fed)
    assert any(f["kind"] == "resumed" for f in state["faults"])
    rec = _record(state, task)
    served = fed.log("edge0").count(f"edge 0: task {task} (")
    replies = [reply for t, reply in fed.answered(0) if t == task]
    # taken exactly once, or asked for again (the resumed cloud re-sent it or let it expire
    # and dispatched the coalition anew): never aggregated twice, never silently dropped
    if rec is None:
        faults = [f for f in state["faults"] if f["kind"] == "lost" and f["coalition"] == 0
                  and task in f["detail"]]
        assert served > 1 or faults, (served, replies, state["faults"][-5:])
    assert sum("aggregated" in r for r in replies) <= 1, replies


def test_after_every_partition_the_history_and_final_model_are_whole(fed):
    from fedcure_app.protocol.codec import decode_arrays

    result = fed.stop_cloud()
    records = result["records"]
    assert version_problems(records) == []
    assert lost_updates(records, _told(fed), key="round") == []
    assert any(f["kind"] == "resumed" for f in result["faults"]) or "4" not in "".join(
        fed.recovery)
    # the final model is the last accepted version (the checkpoint the cloud wrote last)
    final = decode_arrays((fed.out / "final_model.safetensors").read_bytes())
    state = _state(fed)
    version = state["strategy"]["version"]
    assert version == len(records)
    saved = decode_arrays((fed.out / "checkpoint" / f"model-v{version}.safetensors")
                          .read_bytes())
    assert same_model(final, saved)
    # no client trained an edge round of a task twice, but where its edge ran the task again
    # because no client answered an edge round within the edge timeout (a loaded host): the
    # first attempt's replies had expired unread, so nothing of them was aggregated
    rerun = {t for e in range(EDGES) for t in re.findall(
        r"task (\S+) \(coalition \d+\): no client answered", fed.log(f"edge{e}"))}
    for i in range(CLIENTS):
        applied = read_applied(fed.out / "work" / f"client{i}" / "node-data.npz")
        assert applied, i
        twice = [k for k, n in Counter((a["task"], a["edge_round"]) for a in applied).items()
                 if n > 1 and k[0] not in rerun]
        assert twice == [], (i, twice)
    say(f"final: {len(records)} aggregations, {sum(r['late'] for r in records)} late, "
        f"faults {Counter(f['kind'] for f in result['faults'])}")
