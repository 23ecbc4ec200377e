"""The executor's client of its SuperNode's Runtime API: Flower's HTTP client, with retries a
stop ends at once, and a message's objects in one request each way where the SuperNode serves
object batches (:mod:`fedcure_app.flower.fastpath.object_batches`). One client runs every task, the
task's token in its :class:`TaskToken` slot (Flower's ``flwr-clientapp`` builds one per task)."""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

#: the Runtime API client class: Flower's, or one that batches a message's objects
#: (:func:`batch_objects`)
_CLIENT_CLASS: list[Any] = []


def stoppable_retries(stop: threading.Event) -> Any:
    """Flower's HTTP retry invoker for the Runtime API (retries forever, backing off), except
    that it gives up at once when ``stop`` is set and its back-off waits end when it is set:
    without this, SIGTERM goes unanswered while the SuperNode is unreachable."""
    from flwr.supercore.retry import make_simple_http_retry_invoker

    invoker = make_simple_http_retry_invoker()
    giveup = invoker.should_giveup
    invoker.should_giveup = lambda exc: stop.is_set() or bool(giveup and giveup(exc))
    invoker.wait_function = stop.wait
    return invoker


def batch_objects(run_clientapp: ModuleType) -> bool:
    """Have this process's ClientApp side (Flower's ``run_clientapp``) and the clients
    :func:`runtime_client` builds move a message's objects in batches; False (logged) when
    Flower differs."""
    from flwr.supercore.runtime import RuntimeHttpClient

    from fedcure_app.flower.fastpath.object_batches import batching_client, install_executor

    batcher = install_executor(run_clientapp)
    if batcher is None:
        return False
    _CLIENT_CLASS[:] = [batching_client(RuntimeHttpClient, batcher)]
    return True


def runtime_client(address: str, interceptors: list[Any], stop: threading.Event) -> Any:
    """A client of the Runtime API at ``address`` (HOST:PORT, plain HTTP on 127.0.0.1)."""
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor

    return (_CLIENT_CLASS or [RuntimeHttpClient])[0].from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=[RuntimeTracingInterceptor(), *interceptors],
        retry_invoker=stoppable_retries(stop))


class TaskToken:
    """Flower's task-token header (as its ``RuntimeTokenHttpInterceptor``), carrying the token of
    the task being run: one Runtime API client, and its kept-alive connection, serves every task
    of the executor (a client per task cost a new connection and about 4 ms of CPU to build)."""

    def __init__(self) -> None:
        #: the current task's token ("" between tasks: a request then is refused here)
        self.token = ""

    def intercept(self, context: Any, call_next: Any) -> Any:
        from flwr.supercore.constant import TASK_TOKEN_HEADER

        if not self.token:
            raise RuntimeError("no task token: a task request outside a task")
        context.request.headers[TASK_TOKEN_HEADER] = self.token
        return call_next(context)


def task_client(address: str, stop: threading.Event) -> tuple[Any, TaskToken]:
    """The Runtime API client the executor runs its tasks with, and the token slot each task
    sets (:func:`run_task`)."""
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

    token = TaskToken()
    client = runtime_client(address, [
        RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), token], stop)
    return client, token


__all__ = ["TaskToken", "batch_objects", "runtime_client", "stoppable_retries",
           "task_client"]
