"""τ_e synchronous FedAvg rounds over one coalition through a Flower ``Grid``.

The same loop serves the simulation (the Flower executor, virtual SuperNodes) and, later, the
deployed edge role (its own SuperLink). Per edge round it sends one ``train`` Message per client
of the coalition, each built for its node (so every client gets its own CPU-frequency directive
and training seed), pushes them with ``push_messages`` and pulls the replies with a short poll
(``Grid.send_and_receive`` would sleep seconds between polls), then aggregates the answers:
weighted by the sample counts the clients registered (the task's ``client_samples``, capped at
``max_client_weight``: :func:`edge_weights`), or, when the task carries none (the
simulation), with Flower's ``FedAvg.aggregate_train`` weighted by each reply's
``num-examples`` = |D_n|.

Message contents
----------------
Instruction (``RecordDict``):

- ``"arrays"``: :class:`~flwr.app.ArrayRecord` of the edge model (state_dict order);
- ``"config"``: :class:`~flwr.app.ConfigRecord` with ``client-id``, ``tau-c``, ``lr``,
  ``batch-size``, ``freq-ghz`` (the client's directive; ``0.0`` = none), ``seed``
  (= :func:`fedcure_app.tasks.client_train_seed`), ``edge-round``, ``task-id``, ``coalition``,
  ``version``.

Reply: ``"arrays"`` (the trained model) and one :class:`~flwr.app.MetricRecord` with
``num-examples`` (|D_n|; the FedAvg weight only for a task without registered counts),
``samples``, ``seconds``, ``f-applied-ghz``, ``loss``, and optionally ``startup-s``: seconds
of this message the client spent starting up (loading its trainer, model or data) rather than
training; each edge round's slowest start-up adds to :attr:`EdgeResult.startup_s`.

Failures
--------
A client whose reply is an error, is malformed (or has a non-finite loss, time or frequency, a
NaN/Inf model, or a model farther than the task's ``client_step_bound`` from the one it was
sent), could not be pushed, or has not arrived within
``timeout_s`` seconds of the round's push is *dropped*: the round finishes with the clients that
answered (FedAvg weights renormalised over them), the client is listed once in
:attr:`EdgeResult.dropped` and gets no further rounds of this task. A round in which nobody
answers raises :class:`EdgeTaskError` (``refused`` when every client answered and every
answer was refused for its content). The edge sees a reply when its pull returns, and a held
SuperLink keeps a pull waiting up to ``FEDCURE_SUPERLINK_REPLY_HOLD_S`` for one: the pull
running at the deadline and the last pull after it may each bring a reply that landed up to one
hold later, so a reply counts up to ``timeout_s`` plus twice the hold after the push.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedcure_app.core.aggregation import fedavg
from fedcure_app.flower.packing import pack, unpack
from fedcure_app.protocol.text import printable
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask, client_train_seed
from fedcure_app.runtime.tracing import trace

log = logging.getLogger(__name__)

#: Keys of the MetricRecord every train reply carries.
REPLY_METRICS = ("num-examples", "samples", "seconds", "f-applied-ghz", "loss")
#: Optional key of a train reply's MetricRecord: start-up seconds inside the message.
STARTUP_METRIC = "startup-s"


class EdgeTaskError(RuntimeError):
    """No client of the coalition answered an edge round (or none could be reached).

    ``refused``: every client left answered, and every answer was refused for what it holds
    (malformed, non-finite, moved too far): running the task again would bring the same
    answers, so the edge gives the task up instead of looking for its clients again."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class CoalitionGrid(Grid):
    """A view of ``grid`` restricted to one coalition's nodes.

    ``get_node_ids()`` lists the coalition's nodes that the underlying grid currently knows, so a
    Message-API strategy (``FedAvg.configure_train`` samples from ``grid.get_node_ids()``) serves
    exactly the coalition; ``push_messages`` refuses messages addressed to other nodes. Everything
    else is delegated.
    """

    def __init__(self, grid: Grid, node_ids: Iterable[int]) -> None:
        self._grid = grid
        self._nodes: tuple[int, ...] = tuple(dict.fromkeys(int(n) for n in node_ids))
        self._allowed = frozenset(self._nodes)

    @property
    def inner(self) -> Grid:
        """The unrestricted grid."""
        return self._grid

    @property
    def coalition_node_ids(self) -> tuple[int, ...]:
        """The coalition's nodes, whether registered or not, in the order given."""
        return self._nodes

    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(  # noqa: PLR0913
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        self._check_node(dst_node_id)
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> list[int]:
        live = set(self._grid.get_node_ids())
        return [n for n in self._nodes if n in live]

    def get_nodes(self) -> list[Any]:
        return [n for n in self._grid.get_nodes() if n.node_id in self._allowed]

    def _check_node(self, node_id: int) -> None:
        if node_id not in self._allowed:
            raise ValueError(
                f"node {node_id} is not in this coalition (nodes {list(self._nodes)})"
            )

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        msgs = list(messages)
        for m in msgs:
            self._check_node(m.metadata.dst_node_id)
        return list(self._grid.push_messages(msgs))

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return list(self._grid.pull_messages(message_ids))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Push, then pull every 10 ms until all replies are in or ``timeout`` (s) passes."""
        ids = [i for i in self.push_messages(messages) if i]
        replies, _ = pull_replies(self, ids, poll_s=0.01, timeout_s=timeout)
        return list(replies.values())


def pull_replies(
    grid: Grid,
    message_ids: Iterable[str],
    *,
    poll_s: float = 0.01,
    timeout_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_reply: Callable[[set[str]], None] | None = None,
) -> tuple[dict[str, Message], set[str]]:
    """Pull the replies to ``message_ids`` until all are in or ``timeout_s`` passes.

    Returns (message id → reply, ids still unanswered). Each id is pulled only until its reply
    came back: the grid deletes a reply once returned, and asking again gives an error reply.
    ``on_reply(pending ids)`` is called after every pull that brought replies (progress).
    Once the deadline has passed, one more pull collects what came in before it: a pull can
    itself take long (Flower waits for a reply's objects), and replies that arrived meanwhile
    count.
    """
    pending = {i for i in message_ids if i}
    got: dict[str, Message] = {}
    deadline = None if timeout_s is None else clock() + timeout_s
    while pending:
        before = len(pending)
        last = deadline is not None and clock() >= deadline  # then this pull is the last
        for reply in grid.pull_messages(sorted(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                got[mid] = reply
                trace("edge.pulled", mid, reply=getattr(reply.metadata, "message_id", ""))
        if on_reply is not None and len(pending) < before:
            on_reply(set(pending))
        if not pending or last:
            break
        sleep(poll_s)
    return got, pending


# ---------------------------------------------------------------------------------------------
# quiet FedAvg: its aggregate_train logs one INFO line per call, i.e. per edge round


_quiet = threading.local()


class _QuietAggregateFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_quiet, "on", False) and str(record.msg).startswith("%s: Received"):
            return record.levelno > logging.INFO or bool(record.args and record.args[-1])
        return True


_filter_installed = False


@contextmanager
def _quiet_fedavg():
    global _filter_installed
    if not _filter_installed:
        logging.getLogger("flwr").addFilter(_QuietAggregateFilter())
        _filter_installed = True
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = False


_FEDAVG = FedAvg(weighted_by_key="num-examples", arrayrecord_key="arrays")


def _reply_problem(reply: Message, sent: ArrayRecord) -> str | None:
    """Why a train reply cannot be aggregated, or None when it can."""
    if reply.has_error():
        return f"error reply: {reply.error.reason} (code {reply.error.code})"
    content = reply.content
    if len(content.array_records) != 1:
        return f"expected one ArrayRecord, got {len(content.array_records)}"
    arrays = next(iter(content.array_records.values()))
    if list(arrays.keys()) != list(sent.keys()):
        return f"model has tensors {list(arrays.keys())[:5]}…, sent {list(sent.keys())[:5]}…"
    for key in sent.keys():
        got, want = tuple(arrays[key].shape), tuple(sent[key].shape)
        if got != want or arrays[key].dtype != sent[key].dtype:
            return (f"model tensor {key} is {arrays[key].dtype}{list(got)}, sent "
                    f"{sent[key].dtype}{list(want)}")
    if len(content.metric_records) != 1:
        return f"expected one MetricRecord, got {len(content.metric_records)}"
    metrics = next(iter(content.metric_records.values()))
    missing = [k for k in REPLY_METRICS if k not in metrics]
    if missing:
        return f"metrics lack {', '.join(missing)}"
    if not float(metrics["num-examples"]) > 0:
        return f"num-examples must be > 0, got {metrics['num-examples']}"
    for key in ("loss", "seconds", "f-applied-ghz"):
        if not math.isfinite(float(metrics[key])):
            return f"{key} must be finite, got {metrics[key]}"
    if STARTUP_METRIC in metrics and not 0.0 <= float(metrics[STARTUP_METRIC]) < math.inf:
        return f"{STARTUP_METRIC} must be finite seconds >= 0, got {metrics[STARTUP_METRIC]}"
    return None


def _reply_arrays(reply: Message) -> list[np.ndarray]:
    """A well-formed reply's model, in the packed form it travelled in."""
    return next(iter(reply.content.array_records.values())).to_numpy_ndarrays()


def _model_problem(got: list[np.ndarray], sent: list[np.ndarray], bound: float) -> str | None:
    """Why a well-formed reply's model ``got`` cannot be averaged in: NaN/Inf, or farther (L2,
    over all tensors) than ``bound`` from the model ``sent`` in the same packed form (0: no
    bound). The edge drops that client, so that one client's update never makes the cloud
    refuse the coalition's."""
    sq = 0.0
    for a, b in zip(got, sent):
        d = np.asarray(a, dtype=np.float64).ravel() - np.asarray(b, dtype=np.float64).ravel()
        sq += float(np.dot(d, d))
    if not math.isfinite(sq):
        return "model has NaN or Inf values"
    if bound > 0 and math.sqrt(sq) > bound:
        return (f"model moved {math.sqrt(sq):.4g} from the one it was sent, beyond "
                f"lr·τ_c·norm-grad-bound = {bound:.4g}")
    return None


def edge_weights(task: EdgeTask, clients: list[int], replies: list[Message]) -> list[float]:
    """The FedAvg weights of ``clients`` (their ``replies``, same order) in an edge round:
    the counts they registered (``task.client_samples``; a reply's own ``num-examples`` only
    for a client the task lists none for), capped at ``task.max_client_weight``
    (:func:`fedcure_app.core.weight_cap.capped_counts`)."""
    from fedcure_app.core.weight_cap import capped_counts

    counts = []
    for c, reply in zip(clients, replies):
        n = task.client_samples.get(c)
        if n is None or n <= 0:
            n = float(next(iter(reply.content.metric_records.values()))["num-examples"])
        counts.append(float(n))
    cap = float(task.max_client_weight)
    if 0.0 < cap < 1.0:
        return [float(v) for v in capped_counts(counts, cap)]
    return counts


def _train_message(
    arrays: ArrayRecord, task: EdgeTask, client: int, node: int, edge_round: int,
    ttl: float | None, extra: Mapping[str, Any] | None = None,
) -> Message:
    config = ConfigRecord({
        **(extra or {}),
        "client-id": int(client),
        "tau-c": int(task.tau_c),
        "lr": float(task.lr),
        "batch-size": int(task.batch_size),
        "freq-ghz": float(task.frequencies_ghz.get(client, 0.0)),
        "seed": int(client_train_seed(task.seed, edge_round, client)),
        "edge-round": int(edge_round),
        "task-id": str(task.task_id),
        "coalition": int(task.coalition),
        "version": int(task.version),
    })
    return Message(
        RecordDict({"arrays": arrays, "config": config}),
        dst_node_id=int(node),
        message_type=MessageType.TRAIN,
        group_id=f"{task.task_id}/e{edge_round}",
        ttl=ttl,
    )


def run_edge_task(
    grid: Grid,
    task: EdgeTask,
    node_of_client: Mapping[int, int],
    *,
    poll_s: float = 0.01,
    timeout_s: float | None = None,
    extra_config: Mapping[str, Any] | None = None,
    on_round: Callable[[int, float, list[int]], None] | None = None,
    on_progress: Callable[[int, list[int]], None] | None = None,
) -> EdgeResult:
    """Run ``task``: τ_e synchronous FedAvg rounds over its coalition through ``grid``.

    ``node_of_client`` maps client id → Flower node id; ``timeout_s`` bounds each edge round's
    wait for replies (None: wait for all); ``on_round(r, wall_s, clients)`` hears each round's
    wall seconds (push to aggregate) and the clients that answered. See the module docstring for
    the messages and for what happens to clients that fail. ``extra_config`` adds entries to every message's
    ConfigRecord (e.g. a fingerprint of the data the clients must hold). Returns the edge model
    as numpy arrays, with ``num_samples`` = Σ|D_n| over the clients that answered the last
    round. ``on_progress(edge_round, waiting)`` hears where the task stands: the 0-based edge
    round being trained and the clients whose reply it still waits for, when a round starts,
    whenever clients answer, and as ``(tau_e, [])`` once the last round is aggregated.
    """
    if task.tau_e < 1:
        raise ValueError(f"tau_e must be >= 1, got {task.tau_e}")
    if poll_s <= 0:
        raise ValueError(f"poll_s must be > 0, got {poll_s}")
    active: list[int] = []
    dropped: list[int] = []
    for c in task.clients:
        if c in node_of_client:
            active.append(int(c))
        else:
            log.warning("task %s: client %d has no Flower node; dropped", task.task_id, c)
            dropped.append(int(c))
    edge = [np.asarray(a) for a in task.arrays]
    shapes = [a.shape for a in edge]
    reports: list[ClientReport] = []
    num_samples = 0
    startup_s = 0.0
    # messages live twice the round's timeout: a pull can block on a dead client's reply for up
    # to half of it past the deadline (edge role: fedcure_app.flower.fastpath.object_pulls), and the
    # replies that came in meanwhile must still be there for the last pull
    ttl = None if timeout_s is None else max(1.0, 2.0 * float(timeout_s))
    for r in range(task.tau_e):
        if not active:
            raise EdgeTaskError(
                f"task {task.task_id} (coalition {task.coalition}): no client left to train "
                f"edge round {r} (dropped: {dropped})"
            )
        t_round = time.monotonic()
        round_key = f"{task.task_id}/e{r}"
        trace("edge.round_start", round_key)
        # one flat array per message: a third of the objects Flower moves
        # (fedcure_app.flower.packing)
        packed = pack(edge)
        record = ArrayRecord(packed, keep_input=True)
        msgs = [_train_message(record, task, c, node_of_client[c], r, ttl, extra_config)
                for c in active]
        t_push = time.time()
        ids = list(grid.push_messages(msgs))
        if len(ids) != len(msgs):
            raise RuntimeError(f"grid returned {len(ids)} message ids for {len(msgs)} messages")
        trace("edge.pushed", round_key)
        for mid, c in zip(ids, active):
            if mid:  # the SuperLink lists a message before its objects are uploaded
                trace("edge.push", mid, t=t_push, round=round_key, node=int(node_of_client[c]))
        client_of_id = {mid: c for mid, c in zip(ids, active) if mid}
        problems: dict[int, str] = {
            c: "could not be pushed" for mid, c in zip(ids, active) if not mid
        }
        on_reply = None
        if on_progress is not None:
            on_progress(r, sorted(client_of_id.values()))

            def on_reply(waiting: set[str], r: int = r, ids: dict = client_of_id) -> None:
                on_progress(r, sorted(ids[m] for m in waiting))

        got, pending = pull_replies(grid, client_of_id, poll_s=poll_s, timeout_s=timeout_s,
                                    on_reply=on_reply)
        for mid in pending:
            problems[client_of_id[mid]] = f"no reply within {timeout_s} s"
        ok: dict[int, Message] = {}
        models: dict[int, list[np.ndarray]] = {}  # each reply's model, read once
        for mid, reply in got.items():
            c = client_of_id[mid]
            why = _reply_problem(reply, record)
            if why is None:
                models[c] = _reply_arrays(reply)
                why = _model_problem(models[c], packed, task.client_step_bound)
            if why is None:
                ok[c] = reply
            else:
                problems[c] = why
        if problems:
            for c, why in problems.items():
                log.warning("task %s edge round %d: client %d dropped: %s",
                            printable(task.task_id), r, c, printable(why))
        if not ok:
            detail = "; ".join(f"client {c}: {w}" for c, w in sorted(problems.items()))
            answered = {client_of_id[m] for m, reply in got.items() if not reply.has_error()}
            raise EdgeTaskError(
                f"task {task.task_id} (coalition {task.coalition}): no client answered edge "
                f"round {r} of {task.tau_e} ({detail})", refused=set(problems) <= answered)
        survivors = [c for c in active if c in ok]  # coalition order: deterministic sums
        replies = [ok[c] for c in survivors]
        weights = edge_weights(task, survivors, replies)
        try:
            if task.client_samples:  # the registered counts, capped: not the replies' own
                edge = unpack(fedavg([models[c] for c in survivors], weights), shapes)
            else:
                with _quiet_fedavg():
                    arrays, _ = _FEDAVG.aggregate_train(r + 1, replies)
                if arrays is None:  # pragma: no cover - None only without replies
                    raise ValueError("FedAvg returned no model")
                edge = unpack(arrays.to_numpy_ndarrays(), shapes)
        except Exception as err:  # InconsistentMessageReplies: mismatched records
            raise EdgeTaskError(
                f"task {task.task_id} edge round {r}: cannot aggregate the replies of clients "
                f"{survivors}: {err}"
            ) from err
        num_samples = max(1, round(sum(weights)))
        round_startup = 0.0
        for c, reply in zip(survivors, replies):
            m = next(iter(reply.content.metric_records.values()))
            round_startup = max(round_startup, float(m.get(STARTUP_METRIC, 0.0)))
            reports.append(ClientReport(
                client=c, edge_round=r, samples=int(m["samples"]),
                seconds=float(m["seconds"]), f_applied_ghz=float(m["f-applied-ghz"]),
                loss=float(m["loss"]),
            ))
        for c in active:
            if c in problems:
                dropped.append(c)
        active = survivors
        startup_s += round_startup
        trace("edge.round_done", round_key)
        if on_round is not None:
            on_round(r, time.monotonic() - t_round, list(survivors))
    if on_progress is not None:
        on_progress(task.tau_e, [])
    return EdgeResult(
        task_id=task.task_id,
        coalition=task.coalition,
        arrays=edge,
        num_samples=num_samples,
        reports=reports,
        dropped=dropped,
        startup_s=startup_s,
    )


__all__ = ["CoalitionGrid", "EdgeTaskError", "REPLY_METRICS", "STARTUP_METRIC", "pull_replies",
           "run_edge_task"]
