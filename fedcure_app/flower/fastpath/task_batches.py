"""A ClientApp task in two requests between the executor and its SuperNode's Runtime API.

Flower 1.41's ClientApp side (``flwr-clientapp``, and FedCure's executor, which runs its code)
takes a task with eight requests to its SuperNode: ``AcquireTask``, ``PullTaskInput``,
``PullMessages``, the message's objects (one batch,
:mod:`fedcure_app.flower.fastpath.object_batches`), ``ConfirmMessageReceived``; and after training
``PushMessages``, the reply's objects (one batch)
and ``PushTaskOutput``. Each costs both processes their whole HTTP stack, and on an edge's
machine with dozens of clients, or on a small client device, that is most of a task's CPU but
for the training itself.

Two routes on the SuperNode's Runtime API take the same steps, through the same Flower
handlers, in one request each:

- ``POST`` :data:`INPUT_PATH` (an ``AcquireTaskRequest``, signed with the SuperExec secret as
  ``AcquireTask`` is, under :data:`INPUT_METHOD`): acquire a task and, when one was acquired,
  pull its input, its message and the message's objects, and confirm the message received
  when every object came. Answered with a :data:`TaskInput`. A lost answer loses no more than
  a lost ``AcquireTask`` answer does in Flower: the task is acquired either way, and its token
  expires unanswered;
- ``POST`` :data:`OUTPUT_PATH` (a :data:`TaskOutput`, behind the task-token check): push the
  reply message and the objects the SuperNode asks for, then the task's output, with the
  sub-status FAILED when the reply could not be stored (as the executor reports it when its
  push fails). Answered with a :data:`TaskOutputReply`.

Every step calls Flower's handler looked up at call time, so the SuperNode's reply wake-up
(:func:`fedcure_app.flower.fastpath.idle_clock.wake_on_replies`) sees every push. An executor
whose SuperNode does not serve the routes (answered 404) says so once and takes its tasks
Flower's way from then on.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from fedcure_app.flower.fastpath.batch_routes import gather_objects, log_first, serve_routes
from fedcure_app.flower.fastpath.object_batches import MAX_REPLY_BYTES, route_unserved

log = logging.getLogger("fedcure.flower.task_batches")

INPUT_PATH = "/v1/runtime/fedcure-acquire-task-input"
OUTPUT_PATH = "/v1/runtime/fedcure-push-task-output"
#: the names the executor's requests are signed and traced under
INPUT_METHOD = "/fedcure.batch.Runtime/AcquireTaskInput"
OUTPUT_METHOD = "/fedcure.batch.Runtime/PushTaskOutput"


def _wire_schema() -> tuple[type, type, type]:
    """``TaskInput``, ``TaskOutput`` and ``TaskOutputReply`` (package ``fedcure.batch``)."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="fedcure/task_batches.proto",
                                               package="fedcure.batch", syntax="proto3")

    def add(name: str, fields: list[tuple[str, int, bool]]) -> None:
        msg = proto.message_type.add(name=name)
        for field, kind, repeated in fields:
            msg.field.add(name=field, number=len(msg.field) + 1, type=kind,
                          label=f.LABEL_REPEATED if repeated else f.LABEL_OPTIONAL)

    b, s = f.TYPE_BYTES, f.TYPE_STRING
    #: acquire: AcquireTaskResponse; task_input: PullTaskInputResponse; messages:
    #: PullAppMessagesResponse; object_ids/contents: the message's objects that came;
    #: confirmed: the messages confirmed received; input_error: why the input could not be read
    add("TaskInput", [("acquire", b, False), ("task_input", b, False), ("messages", b, False),
                      ("object_ids", s, True), ("contents", b, True), ("confirmed", s, True),
                      ("input_error", s, False)])
    #: push_messages: PushAppMessagesRequest (empty: no reply); object_pushes: its objects'
    #: PushObjectRequests (session left empty); task_output: PushTaskOutputRequest
    add("TaskOutput", [("push_messages", b, False), ("object_pushes", b, True),
                       ("task_output", b, False)])
    #: push_reply: PushAppMessagesResponse; push_error: why the reply was not stored
    add("TaskOutputReply", [("push_reply", b, False), ("push_error", s, False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"fedcure.batch.{n}"))
                 for n in ("TaskInput", "TaskOutput", "TaskOutputReply"))  # type: ignore


TaskInput, TaskOutput, TaskOutputReply = _wire_schema()


class ReplyNotStored(RuntimeError):
    """The SuperNode did not store an object of the reply."""


# ------------------------------------------------------------------------- the SuperNode's side

def _first_use() -> None:
    """Log the first task taken over the bundle route in this process."""
    log_first("task bundles", log, "tasks in two requests each (%s, %s)", INPUT_PATH,
              OUTPUT_PATH)


def acquire_with_input(request: Any, state: Any, handlers: Any,
                       max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """Acquire a task (``handlers.acquire_task``) and gather its input into a :data:`TaskInput`:
    the task input, the message, its objects up to ``max_bytes`` and, when all of a message's
    objects came, its confirmation. A failure after the task was acquired is answered in
    ``input_error`` (the executor fails the task with it, as a failed ``PullTaskInput``)."""
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, PullObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest

    acquired = handlers.acquire_task(request, state)
    out = TaskInput(acquire=acquired.SerializeToString())
    if not (acquired.HasField("task") and acquired.token):
        return out
    task = state.get_task_by_token(acquired.token)
    if task is None:  # expired between the two calls: the executor asks Flower's way and fails
        return out
    _first_use()
    try:
        task_input = handlers.pull_task_input(PullTaskInputRequest(), state, task)
        messages = handlers.pull_messages(PullAppMessagesRequest(), state, task)
    except Exception as err:  # noqa: BLE001 - answered; the executor fails the task with it
        log.warning("task %d: its input could not be gathered: %s", task.task_id, err)
        out.input_error = f"{type(err).__name__}: {err}"
        return out
    node = Node(node_id=task_input.context.node_id)
    ids, contents, confirmed = gather_objects(
        ((tree.object_id, task.run_id, tree) for tree in messages.message_object_trees),
        lambda run_id, oid: handlers.pull_object(
            PullObjectRequest(node=node, run_id=run_id, object_id=oid), state, task),
        lambda run_id, mid: handlers.confirm_message_received(ConfirmMessageReceivedRequest(
            node=node, run_id=run_id, message_object_id=mid), state, task),
        max_bytes)
    out.object_ids.extend(ids)
    out.contents.extend(contents)
    out.confirmed.extend(confirmed)
    out.task_input = task_input.SerializeToString()
    out.messages = messages.SerializeToString()
    return out


def push_output(bundle: Any, state: Any, handlers: Any, task: Any) -> Any:
    """Store a task's reply and its objects, then its output (``handlers``: Flower's); a reply
    that could not be stored is answered in ``push_error`` and the task ends FAILED."""
    from flwr.common.constant import SubStatus
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.runtime_pb2 import PushAppMessagesRequest, PushTaskOutputRequest

    reply = TaskOutputReply()
    output = PushTaskOutputRequest.FromString(bundle.task_output)
    if bundle.push_messages:
        try:
            pushed = handlers.push_messages(
                PushAppMessagesRequest.FromString(bundle.push_messages), state, task)
            wanted = set(pushed.objects_to_push)
            for raw in bundle.object_pushes:
                push = PushObjectRequest.FromString(raw)
                if push.object_id not in wanted:
                    continue  # the SuperNode has it already
                push.session_id = pushed.session_id
                if not handlers.push_object(push, state, task).stored:
                    raise ReplyNotStored(f"object {push.object_id} was not stored")
            reply.push_reply = pushed.SerializeToString()
        except Exception as err:  # noqa: BLE001 - the task ends FAILED, saying why
            reply.push_error = f"{type(err).__name__}: {err}"
            output.sub_status = SubStatus.FAILED
            output.details = f"could not push the reply: {reply.push_error}"
    handlers.push_task_output(output, state, task)
    return reply


def serve_output(bundle: Any, state: Any, handlers: Any, task: Any) -> Any:
    """:func:`push_output`, a bundle whose parts are not Flower's messages answered 400."""
    from fastapi import HTTPException, status
    from google.protobuf.message import DecodeError

    try:
        return push_output(bundle, state, handlers, task)
    except DecodeError:
        raise HTTPException(status_code=status.HTTP_400_BAD_REQUEST,
                            detail="the task output's parts are not Flower's messages") from None


def fast_routes() -> dict[str, Any]:
    """The two routes for :class:`~fedcure_app.flower.fastpath.fast_routes.FastRoutes`: Flower's own
    checks (the SuperExec signature, the task's token) and handlers, without its HTTP stack."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TASK_TOKEN_HEADER
    from flwr.supercore.dependencies.runtime import get_runtime_handlers, get_runtime_state
    from flwr.supercore.dependencies.superexec import authenticate_superexec_request
    from flwr.supercore.dependencies.task import authenticate_task

    from fedcure_app.flower.fastpath.fast_routes import Route

    def take(request: Any, message: Any) -> Any:
        state = get_runtime_state(request)
        authenticate_superexec_request(request, state, INPUT_METHOD)
        return acquire_with_input(message, state, get_runtime_handlers(request))

    def finish_task(request: Any, message: Any) -> Any:
        state = get_runtime_state(request)
        task = authenticate_task(request, request.headers.get(TASK_TOKEN_HEADER), state)
        return serve_output(message, state, get_runtime_handlers(request), task)

    return {INPUT_PATH: Route(AcquireTaskRequest, take),
            OUTPUT_PATH: Route(TaskOutput, finish_task)}


def task_router() -> Any:
    """The two routes, as a FastAPI router of Flower's protobuf routes."""
    from typing import Annotated

    from fastapi import APIRouter, Depends
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.dependencies.runtime import (
        RuntimeHandlersDependency,
        RuntimeStateDependency,
        SuperExecAuthDependency,
        TaskDependency,
    )
    from flwr.supercore.protobuf.routing import ProtobufRoute
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_DEPENDENCY

    router = APIRouter(route_class=ProtobufRoute)

    def fedcure_runtime_acquire_task_input(request: Any, state: Any, handlers: Any,
                                           _auth: Any) -> Any:
        return acquire_with_input(request, state, handlers)

    def fedcure_runtime_push_task_output(request: Any, state: Any, handlers: Any,
                                         task: Any) -> Any:
        return serve_output(request, state, handlers, task)

    # real objects, not this module's postponed (string) annotations (FastAPI resolves them)
    fedcure_runtime_acquire_task_input.__annotations__ = {
        "request": Annotated[AcquireTaskRequest, PROTOBUF_REQUEST_DEPENDENCY],
        "state": RuntimeStateDependency, "handlers": RuntimeHandlersDependency,
        "_auth": Annotated[None, Depends(SuperExecAuthDependency(INPUT_METHOD))],
        "return": TaskInput}
    fedcure_runtime_push_task_output.__annotations__ = {
        "request": Annotated[TaskOutput, PROTOBUF_REQUEST_DEPENDENCY],
        "state": RuntimeStateDependency, "handlers": RuntimeHandlersDependency,
        "task": TaskDependency, "return": TaskOutputReply}
    router.post(INPUT_PATH)(fedcure_runtime_acquire_task_input)
    router.post(OUTPUT_PATH)(fedcure_runtime_push_task_output)
    return router


def install_server() -> bool:
    """Make every SuperNode app built in this process (``flwr.supernode.main.create_app``)
    serve the two routes; False (logged) when Flower differs from what this was written for."""
    import flwr.supernode.main as main
    from flwr.proto.runtime_pb2 import AcquireTaskRequest

    from fedcure_app.flower.fastpath import fast_routes as fast

    return serve_routes(main, {INPUT_PATH: AcquireTaskRequest, OUTPUT_PATH: TaskOutput},
                        [task_router], "task bundles", patch="task_batches") and fast.install(
        main, fast_routes, "task bundles")


# -------------------------------------------------------------------------- the executor's side


class TaskRequests:
    """The executor's side: takes and finishes tasks over the two routes while its SuperNode
    serves them (:attr:`enabled`), else says so once and leaves each call to Flower's way."""

    def __init__(self) -> None:
        self.enabled = True
        self._lock = threading.Lock()

    def _unserved(self, err: Exception) -> bool:
        if not route_unserved(err):
            return False
        with self._lock:
            if self.enabled:
                log.info("the SuperNode does not serve %s: tasks go Flower's way",
                         INPUT_PATH)
            self.enabled = False
        return True

    def acquire(self, client: Any, request: Any) -> tuple[Any, Any]:
        """``AcquireTask`` over ``client`` (signed with the SuperExec secret): its answer and,
        through the bundle route, the task's :data:`TaskInput` (None: pull it Flower's way)."""
        from flwr.proto.runtime_pb2 import AcquireTaskResponse

        if self.enabled:
            try:
                got = client._unary_unary(path=INPUT_PATH, rpc_method=INPUT_METHOD,
                                          request=request, response_type=TaskInput)
            except Exception as err:
                if not self._unserved(err):
                    raise
            else:
                return AcquireTaskResponse.FromString(got.acquire), got
        return client.AcquireTask(request), None


def inputs(client: Any, bundle: Any) -> tuple[Any, Any, Any, Any]:
    """``(message, context, run, fab)`` from a :data:`TaskInput`, as Flower's
    ``pull_task_input`` returns them; objects it does not carry are pulled over ``client``
    (the task's), and a message not confirmed is confirmed over it."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse, PullTaskInputResponse
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        inflate_object_from_contents,
        pull_and_inflate_object_from_tree,
    )
    from flwr.supercore.task_identity import TaskIdentity

    if bundle.input_error:
        raise RuntimeError(f"the task's input could not be read: {bundle.input_error}")
    res = PullTaskInputResponse.FromString(bundle.task_input)
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run, fab = run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = PullAppMessagesResponse.FromString(bundle.messages)
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    tree = pulled.message_object_trees[0]
    node = Node(node_id=context.node_id)
    carried = dict(zip(bundle.object_ids, bundle.contents))
    if tree.object_id in bundle.confirmed:  # every object came: no pulls (and no thread pool)
        message = inflate_object_from_contents(tree.object_id, carried)
        if not isinstance(message, Message):
            raise RuntimeError(f"the task's message is a {type(message).__name__}")
    else:
        remote = make_pull_object_fn_protobuf(client.PullObject, node, context.run_id)

        def pull(object_id: str) -> bytes:
            content = carried.pop(object_id, None)
            return remote(object_id) if content is None else content

        message = pull_and_inflate_object_from_tree(
            tree, pull, make_confirm_message_received_fn_protobuf(
                client.ConfirmMessageReceived, node, context.run_id), return_type=Message)
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's pull_task_input
    return message, context, run, fab


def output(reply: Any, context: Any, sub_status: str, details: str) -> Any:
    """The :data:`TaskOutput` of a task: its reply (None: no reply), its objects and its
    output, as Flower's ``push_message`` and ``push_task_output`` send them."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import context_to_proto, message_to_proto
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PushAppMessagesRequest, PushTaskOutputRequest
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )

    bundle = TaskOutput(task_output=PushTaskOutputRequest(
        context=context_to_proto(context) if context else None, sub_status=sub_status,
        details=details).SerializeToString())
    if reply is None or context is None:
        return bundle
    reply.metadata.__dict__["_message_id"] = reply.object_id
    proto = message_to_proto(remove_content_from_message(reply))
    node = Node(node_id=context.node_id)
    with no_object_id_recompute():
        bundle.push_messages = PushAppMessagesRequest(
            messages_list=[proto], message_object_trees=[get_object_tree(reply)]
        ).SerializeToString()
        for oid, obj in get_all_nested_objects(reply).items():
            bundle.object_pushes.append(PushObjectRequest(
                node=node, run_id=context.run_id, object_id=oid,
                object_content=obj.deflate()).SerializeToString())
    return bundle


def send_output(client: Any, bundle: Any) -> str:
    """Send a :data:`TaskOutput` over ``client`` (the task's); why its reply was not stored
    ("" when it was)."""
    got = client._unary_unary(path=OUTPUT_PATH, rpc_method=OUTPUT_METHOD, request=bundle,
                              response_type=TaskOutputReply)
    return got.push_error


def finish(client: Any, bundled: bool, task_id: int, reply: Any, context: Any,
           sub_status: str, details: str) -> str:
    """End a task over ``client`` (the task's): push its reply (None: none), then its status,
    in one request when ``bundled`` (the task came through the bundle route), else Flower's
    way (``push_message``, ``push_task_output``); the final sub-status (FAILED when the reply
    was not stored). A request that fails is logged, as Flower's ``push_task_output`` does."""
    import httpx
    from flwr.common.constant import SubStatus
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    if not bundled:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except Exception as err:  # noqa: BLE001
            log.error("task %d: could not push the reply: %s", task_id, err)
            sub_status = SubStatus.FAILED
        push_task_output(client=client, context=context, sub_status=sub_status,
                         details=details)
        return sub_status
    try:
        error = send_output(client, output(reply, context, sub_status, details))
    except httpx.HTTPError as err:
        log.error("task %d: could not push the reply and status: %s", task_id, err)
        return SubStatus.FAILED
    if error:
        log.error("task %d: could not push the reply: %s", task_id, error)
        return SubStatus.FAILED
    return sub_status


__all__ = ["INPUT_METHOD", "INPUT_PATH", "OUTPUT_METHOD", "OUTPUT_PATH",
           "ReplyNotStored", "TaskInput", "TaskOutput", "TaskOutputReply", "TaskRequests",
           "acquire_with_input", "fast_routes", "finish", "inputs", "install_server", "output",
           "push_output", "send_output", "serve_output", "task_router"]
