"""Held pulls on the edge's SuperLink: an empty pull waits for a message instead of answering at
once, a push wakes exactly the pulls it concerns, and the SuperNode asks again at once after a
held pull but keeps its back-off against a SuperLink that does not hold."""

from __future__ import annotations

import threading
import time
import types
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.flower.fastpath.idle_clock import IdleClock, wake_on_replies
from fedcure_app.flower.fastpath.idle_clock import install as install_supernode
from client.wake import WAKE_FALLBACK_S, WAKE_QUICK_S, AskPacer
from fedcure_app.config import ConfigError, EdgeLinkConfig
from fedcure_app.flower.fastpath import held_pulls
from fedcure_app.flower.fastpath.held_pulls import AwaitedObjects, Doorbell, check_flower, install


# ------------------------------------------------------------------ a fake SuperLink's handlers
@dataclass
class Meta:
    dst_node_id: int = 0


@dataclass
class Msg:
    metadata: Meta


@dataclass
class Reply:
    messages_list: list = field(default_factory=list)


@dataclass
class Node:
    node_id: int


@dataclass
class FleetPull:
    node: Node


@dataclass
class RuntimePull:
    message_ids: list


@dataclass
class Push:
    messages_list: list
    #: objects the SuperLink says it still needs (the push's answer)
    missing: list = field(default_factory=list)


@dataclass
class Pushed:
    objects_to_push: list


@dataclass
class ObjectPush:
    object_id: str


def fake_link() -> tuple[types.ModuleType, types.ModuleType, dict]:
    """Fleet and runtime handler modules over one in-memory store (node -> messages)."""
    db: dict = {"ins": {}, "res": [], "pulls": 0, "objects": set()}
    fleet = types.ModuleType("fake_fleet_handlers")
    runtime = types.ModuleType("fake_runtime_handlers")

    def fleet_pull(request, state, store):
        db["pulls"] += 1
        return Reply(db["ins"].pop(request.node.node_id, []))

    def fleet_push(request, state):
        db["res"].extend(request.messages_list)
        return Pushed(list(request.missing))

    def runtime_pull(request, state, task):
        db["pulls"] += 1
        got, db["res"] = db["res"], []
        return Reply(got)

    def runtime_push(request, state, task):
        for m in request.messages_list:
            db["ins"].setdefault(m.metadata.dst_node_id, []).append(m)
        return Pushed(list(request.missing))

    def fleet_push_object(request, state):
        db["objects"].add(request.object_id)

    def runtime_push_object(request, state, task):
        db["objects"].add(request.object_id)

    fleet.pull_messages, fleet.push_messages = fleet_pull, fleet_push
    runtime.pull_messages, runtime.push_messages = runtime_pull, runtime_push
    fleet.push_object, runtime.push_object = fleet_push_object, runtime_push_object
    return fleet, runtime, db


def _in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        out["reply"] = fn(*args)
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_pull_that_finds_nothing_waits_the_hold_and_answers_empty():
    fleet, runtime, store = fake_link()
    assert install(0.3, 0.3, fleet=fleet, runtime=runtime) is not None
    t0 = time.monotonic()
    assert fleet.pull_messages(FleetPull(Node(5)), None, None).messages_list == []
    assert time.monotonic() - t0 >= 0.29
    assert store["pulls"] == 1  # no ring: one look, then the hold, no second look


def test_a_push_wakes_the_held_pull_of_its_node_at_once_and_not_the_others():
    fleet, runtime, _ = fake_link()
    install(5.0, 5.0, fleet=fleet, runtime=runtime)
    waiting, got = _in_thread(fleet.pull_messages, FleetPull(Node(1)), None, None)
    other, other_got = _in_thread(fleet.pull_messages, FleetPull(Node(2)), None, None)
    time.sleep(0.1)
    runtime.push_messages(request=Push([Msg(Meta(1))]), state=None, task=None)  # as routers do
    waiting.join(2.0)
    assert not waiting.is_alive() and len(got["reply"].messages_list) == 1
    assert got["took"] < 1.0
    assert other.is_alive()  # node 2 had nothing pushed: it still waits
    runtime.push_messages(Push([Msg(Meta(2))]), None, None)
    other.join(2.0)
    assert len(other_got["reply"].messages_list) == 1


def test_a_reply_wakes_the_servers_held_pull_of_replies():
    fleet, runtime, _ = fake_link()
    install(5.0, 5.0, fleet=fleet, runtime=runtime)
    waiting, got = _in_thread(runtime.pull_messages, RuntimePull(["m1"]), None, None)
    time.sleep(0.1)
    fleet.push_messages(request=Push([Msg(Meta())]), state=None)
    waiting.join(2.0)
    assert len(got["reply"].messages_list) == 1 and got["took"] < 1.0


def test_a_held_pull_is_woken_only_once_the_objects_its_message_announced_have_landed():
    fleet, runtime, _ = fake_link()
    install(5.0, 5.0, fleet=fleet, runtime=runtime)
    waiting, got = _in_thread(fleet.pull_messages, FleetPull(Node(1)), None, None)
    time.sleep(0.1)
    runtime.push_messages(Push([Msg(Meta(1))], missing=["model", "config"]), None, None)
    time.sleep(0.2)
    assert waiting.is_alive()  # the header is in, its objects are not: fetching would fail
    runtime.push_object(ObjectPush("model"), None, None)
    time.sleep(0.1)
    assert waiting.is_alive()
    runtime.push_object(request=ObjectPush("config"), state=None, task=None)
    waiting.join(2.0)
    assert not waiting.is_alive() and len(got["reply"].messages_list) == 1


def test_a_reply_rings_the_server_once_its_objects_are_in():
    fleet, runtime, _ = fake_link()
    install(5.0, 5.0, fleet=fleet, runtime=runtime)
    waiting, got = _in_thread(runtime.pull_messages, RuntimePull(["m1"]), None, None)
    time.sleep(0.1)
    fleet.push_messages(Push([Msg(Meta())], missing=["reply-arrays"]), None)
    time.sleep(0.2)
    assert waiting.is_alive()
    fleet.push_object(ObjectPush("reply-arrays"), None)
    waiting.join(2.0)
    assert len(got["reply"].messages_list) == 1


def test_awaited_objects_ring_once_when_the_last_lands_and_expire_if_they_never_do():
    now = [0.0]
    awaited = AwaitedObjects(expire_s=30.0, clock=lambda: now[0])
    rung: list[str] = []
    awaited.add([], lambda: rung.append("none missing"))
    assert rung == ["none missing"]
    awaited.add(["a", "b"], lambda: rung.append("ab"))
    awaited.add(["b"], lambda: rung.append("b"))
    awaited.add(["never"], lambda: rung.append("never"))
    awaited.stored("b")
    assert rung == ["none missing", "b"]
    awaited.stored("a")
    assert rung == ["none missing", "b", "ab"] and awaited.pending() == 1
    now[0] = 31.0
    awaited.stored("unrelated")  # the sender of "never" died: its ring goes after expire_s
    assert rung[-1] == "never" and awaited.pending() == 0


@settings(max_examples=40, deadline=None)
@given(objects=st.lists(st.sets(st.sampled_from("abcdef"), max_size=4), max_size=6),
       order=st.permutations(list("abcdef")))
def test_every_ring_comes_exactly_once_after_all_its_objects(objects, order):
    awaited = AwaitedObjects(expire_s=1e9, clock=lambda: 0.0)
    rung: dict[int, int] = {}
    seen: set[str] = set()
    for i, objs in enumerate(objects):
        def ring(i: int = i, objs: set = objs) -> None:
            assert objs <= seen  # never before its objects
            rung[i] = rung.get(i, 0) + 1
        awaited.add(objs, ring)
    for o in order:
        seen.add(o)
        awaited.stored(o)
    assert rung == {i: 1 for i in range(len(objects))}


def test_a_runtime_pull_of_no_ids_is_not_held():
    fleet, runtime, _ = fake_link()
    install(5.0, 5.0, fleet=fleet, runtime=runtime)
    t0 = time.monotonic()
    runtime.pull_messages(RuntimePull([]), None, None)
    assert time.monotonic() - t0 < 0.5


def test_a_ring_between_the_look_and_the_wait_is_not_lost():
    bell = Doorbell()
    mark = bell.node_mark(3)
    bell.ring_nodes([3])  # came in after the pull looked
    t0 = time.monotonic()
    assert bell.wait_node(3, mark, 5.0)
    assert time.monotonic() - t0 < 0.5
    assert not bell.wait_node(3, bell.node_mark(3), 0.05)


@settings(max_examples=30, deadline=None)
@given(rings=st.lists(st.integers(0, 5), max_size=20), node=st.integers(0, 5))
def test_a_nodes_mark_changes_exactly_when_it_was_rung(rings, node):
    bell = Doorbell()
    mark = bell.node_mark(node)
    bell.ring_nodes(rings)
    assert (bell.node_mark(node) != mark) == (node in rings)
    assert bell.node_mark(node) - mark == rings.count(node)


def test_handlers_of_another_shape_are_left_alone():
    fleet, runtime, _ = fake_link()

    def pull(request, state):  # lost its store argument
        return Reply()

    fleet.pull_messages = pull
    assert any("no longer takes" in p for p in check_flower(fleet, runtime, version="1.41.0"))
    assert install(1.0, 1.0, fleet=fleet, runtime=runtime) is None
    assert fleet.pull_messages is pull


def test_the_patch_fits_the_installed_flower():
    assert check_flower() == []


def test_the_servers_thread_pool_is_widened_on_its_first_request():
    import anyio
    import anyio.to_thread

    seen: list[int] = []

    async def app(scope, receive, send):
        seen.append(anyio.to_thread.current_default_thread_limiter().total_tokens)

    async def main() -> None:
        mw = held_pulls.ThreadPoolWidth(app, threads=300)
        await mw({}, None, None)
        await mw({}, None, None)

    anyio.run(main)
    assert seen == [300, 300]


def test_edge_link_settings_are_range_checked():
    held = EdgeLinkConfig.from_env({})  # on by default, and Flower's behaviour at 0
    assert (held.superlink_hold_s, held.superlink_reply_hold_s) == (20.0, 2.0)
    assert EdgeLinkConfig.from_env({"FEDCURE_SUPERLINK_HOLD_S": "0"}).superlink_hold_s == 0.0
    assert EdgeLinkConfig.from_env({"FEDCURE_SUPERLINK_HOLD_S": "20"}).superlink_hold_s == 20.0
    with pytest.raises(ConfigError):
        EdgeLinkConfig.from_env({"FEDCURE_SUPERLINK_HOLD_S": "40"})  # past the 30 s timeout
    with pytest.raises(ConfigError):
        EdgeLinkConfig.from_env({"FEDCURE_SUPERLINK_THREADS": "8"})


# ------------------------------------------------------------------ the SuperNode's side
def test_after_a_held_empty_pull_the_supernode_asks_again_at_once(monkeypatch):
    from flwr.supernode import start_client_internal as loop

    saved = loop.time, loop._pull_and_store_message, loop.pull_objects
    monkeypatch.setattr(held_pulls, "HELD_MIN_S", 0.05)
    monkeypatch.setattr("fedcure_app.flower.fastpath.idle_clock.HELD_MIN_S", 0.05)
    try:
        def held_pull(*args, **kwargs):
            time.sleep(0.06)  # the SuperLink held it
            return None

        loop._pull_and_store_message = held_pull
        clock = IdleClock(0.01, 0.2, 0.01, sleep=lambda s: None)
        assert install_supernode(clock, loop)
        for _ in range(4):
            clock.next_idle_s()  # back-off grown to 0.2
        assert loop._pull_and_store_message() is None
        assert clock.next_idle_s() == 0.01  # held: ask again without backing off
        loop._pull_and_store_message = lambda *a, **k: None  # a SuperLink that answers at once
        install_supernode(clock, loop)
        for _ in range(6):
            loop._pull_and_store_message()
            wait = clock.next_idle_s()
        assert wait == 0.2  # its back-off stays
    finally:
        loop.time, loop._pull_and_store_message, loop.pull_objects = saved


def test_the_supernode_waits_for_its_clientapps_push_instead_of_polling():
    handlers = types.ModuleType("fake_supernode_runtime_handlers")
    handlers.push_messages = lambda request, state, task: "stored"
    handlers.push_object = lambda request, state, task: "stored"
    slept: list[float] = []
    clock = IdleClock(0.01, 0.2, 0.01, sleep=slept.append)
    assert wake_on_replies(clock, handlers)
    t0 = time.monotonic()
    clock.sleep(0.5)  # nothing pushed: Flower's own 0.5 s, as a fallback only
    assert 0.45 <= time.monotonic() - t0 < 1.5 and slept == []
    pusher = threading.Timer(0.1, lambda: handlers.push_object("obj", None, None))
    pusher.start()
    t0 = time.monotonic()
    clock.sleep(0.5)
    assert time.monotonic() - t0 < 0.4  # woken by the push
    assert handlers.push_messages("m", None, None) == "stored"  # the handlers still answer
    assert wake_on_replies(clock, handlers)  # installing twice wraps once
    assert handlers.push_object.__wrapped__.__name__ == "<lambda>"


def test_a_supernode_without_those_handlers_keeps_its_poll():
    clock = IdleClock(0.01, 0.2, 0.01, sleep=lambda s: None)
    assert not wake_on_replies(clock, types.ModuleType("empty"))
    assert clock.reply_event is None


# ------------------------------------------------------------------ the executor's asks
@settings(max_examples=60, deadline=None)
@given(lo=st.floats(0.001, 0.2), hi=st.floats(0.01, 5.0), events=st.lists(
    st.sampled_from(["empty", "task", "wake"]), max_size=40))
def test_executor_asks_are_bounded_and_a_woken_executor_idles_at_the_fallback(lo, hi, events):
    hi = max(lo, hi)
    for woken in (False, True):
        pacer = AskPacer(lo, hi, woken=woken)
        for e in events:
            if e == "task":
                pacer.task_done()
            elif e == "wake":
                pacer.woke()
            wait = pacer.next_wait() if e == "empty" else None
            if wait is not None:
                assert lo <= wait <= (max(hi, WAKE_FALLBACK_S) if woken else hi)
        waits = [pacer.next_wait() for _ in range(30)]
        if woken:
            assert waits[-1] == max(hi, WAKE_FALLBACK_S)  # idle: one ask per fallback
        else:
            assert waits[-1] == hi


def test_a_woken_executor_asks_once_after_a_task_then_waits_for_the_wake():
    pacer = AskPacer(0.005, 0.1, woken=True)
    pacer.task_done()
    assert pacer.next_wait() == WAKE_FALLBACK_S  # the ask right after the task was empty
    pacer.woke()
    quick = [pacer.next_wait() for _ in range(9)]
    assert quick[0] == 0.005 and all(b == 2 * a for a, b in zip(quick, quick[1:7]))
    assert max(q for q in quick if q < WAKE_FALLBACK_S) <= WAKE_QUICK_S
    assert quick[-1] == WAKE_FALLBACK_S


def test_a_client_asks_often_enough_to_see_the_end_of_training():
    """The cloud answers DONE for ``linger_s`` after the last round, then stops: a client's
    asks must come closer than that, or it takes the finished cloud for lost."""
    import inspect

    from client.children import STATUS_EVERY_S, WATCH_EVERY_S
    from cloud_server.server import serve

    linger = inspect.signature(serve).parameters["linger_s"].default
    assert STATUS_EVERY_S + WATCH_EVERY_S < linger


def test_a_stopping_server_lets_every_held_pull_go_at_once():
    fleet, runtime, _ = fake_link()
    bell = install(20.0, 20.0, fleet=fleet, runtime=runtime)
    waiting, got = _in_thread(fleet.pull_messages, FleetPull(Node(1)), None, None)
    replies, got_replies = _in_thread(runtime.pull_messages, RuntimePull(["m"]), None, None)
    time.sleep(0.1)
    bell.close()
    waiting.join(2.0)
    replies.join(2.0)
    assert not waiting.is_alive() and not replies.is_alive()
    assert got["took"] < 1.0 and got_replies["took"] < 1.0
    t0 = time.monotonic()
    fleet.pull_messages(FleetPull(Node(2)), None, None)  # no new pull waits either
    assert time.monotonic() - t0 < 0.5


def test_no_pull_is_held_where_the_servers_stop_cannot_let_it_go(caplog):
    from edge_server.held_superlink import holds

    assert holds(20.0, 2.0, quiet=True) == (20.0, 2.0)
    assert holds(0.0, 0.0, quiet=False) == (0.0, 0.0)
    with caplog.at_level("WARNING", logger="fedcure.edge.superlink"):
        assert holds(20.0, 2.0, quiet=False) == (0.0, 0.0)
    assert "not held" in caplog.text
