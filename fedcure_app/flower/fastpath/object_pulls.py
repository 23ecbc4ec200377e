"""Flower's object pulls with short retry waits (the warm client and the edge role).

Flower 1.41 moves a message as a small header plus content objects (the model's arrays). A
receiver pulls the objects one by one, and an object that is not there yet raises
``ObjectUnavailableError``, after which Flower waits ``PULL_INITIAL_BACKOFF`` = 1 s, doubling up
to 10 s (``flwr.supercore.inflatable.inflatable_utils.pull_objects``). In an edge round that
happens on every hop, because each sender announces a message before its objects have landed:

- the SuperNode creates the ClientApp task before it has pulled the message's objects from the
  SuperLink, so the ClientApp's first object pull nearly always finds nothing and sleeps 1 s;
- the edge ServerApp pulls a reply as soon as the SuperLink lists it, usually before the
  SuperNode has pushed its objects.

Each such wait is a full second of an edge round that is neither training nor transfer. The
waits are keyword arguments of Flower's pull functions, so :func:`quick_pulls` wraps a module's
reference to one of them with other defaults: the first retry after ``first_s`` (default
0.01 s), doubling up to ``cap_s`` (0.2 s). A caller that passes its own values keeps them. The
total patience stays Flower's (``max_time``, 7200 s): the number of tries is left unbounded
instead of 500, so the shorter waits never give up sooner than Flower would. The edge bounds it
by half its ``--edge-timeout`` instead: a client killed while uploading its reply leaves the
reply listed with objects that never come, and Flower's pull of the replies then blocks the whole
edge round (every other client's reply included) until the SuperLink's upload session expires,
minutes later, by when the other replies have outlived their TTL; with the bound, that one reply
becomes an error reply, the client is dropped like any other that did not answer, and the other
replies (whose messages live twice the edge timeout, :func:`fedcure_app.flower.edge.run_edge_task`)
are still there to be pulled.

Only a Flower inside the fast path's gate (:mod:`fedcure_app.flower.fastpath.gate`, the pin in
pyproject.toml) is patched, and only when the function still takes those keywords
(:func:`check_pull_function`); otherwise nothing changes and a warning says why.
``tests/deployment/test_warm_client.py`` fails when Flower changes underneath.
"""

from __future__ import annotations

import functools
import inspect
import logging
from types import ModuleType
from typing import Any, Callable

from fedcure_app.flower.fastpath.gate import report_off, version_problem

log = logging.getLogger("fedcure.object_pulls")

#: the keywords of Flower's pull functions this module sets
KEYWORDS = ("initial_backoff", "backoff_cap", "max_tries_per_object", "max_time")
#: default first wait and longest wait between tries for an object not there yet (seconds)
FIRST_S, CAP_S = 0.01, 0.2
#: marks a function this module already wrapped
_MARK = "__fedcure_quick_pulls__"


def check_pull_function(func: Any, version: str | None = None) -> list[str]:
    """Why ``func`` cannot be given short waits (empty when it can)."""
    outside = version_problem(version, patch="object_pulls")
    problems: list[str] = [] if outside is None else [outside]
    if not callable(func):
        return [*problems, f"{func!r} is not a function"]
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError) as err:
        return [*problems, f"cannot read the signature of {func!r}: {err}"]
    missing = [k for k in KEYWORDS if k not in params]
    if missing:
        problems.append(f"{getattr(func, '__qualname__', func)} no longer takes "
                        f"{', '.join(missing)}")
    return problems


def quick(func: Callable[..., Any], first_s: float = FIRST_S, cap_s: float = CAP_S,
          max_time_s: float | None = None) -> Callable[..., Any]:
    """``func`` with a first retry after ``first_s`` doubling up to ``cap_s`` and unbounded
    tries, unless the caller says otherwise. The whole pull gives up after ``max_time_s``
    seconds when given, else after Flower's ``max_time`` (7200 s)."""
    if not 0 < first_s <= cap_s:
        raise ValueError(f"need 0 < first_s <= cap_s, got {first_s}, {cap_s}")
    if max_time_s is not None and not max_time_s > 0:
        raise ValueError(f"max_time_s must be > 0, got {max_time_s}")

    @functools.wraps(func)
    def pull(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("initial_backoff", first_s)
        kwargs.setdefault("backoff_cap", cap_s)
        kwargs.setdefault("max_tries_per_object", None)
        if max_time_s is not None:
            kwargs.setdefault("max_time", max_time_s)
        return func(*args, **kwargs)

    setattr(pull, _MARK, (first_s, cap_s, max_time_s))
    return pull


def quick_pulls(module: ModuleType, name: str, first_s: float = FIRST_S, cap_s: float = CAP_S,
                max_time_s: float | None = None) -> bool:
    """Replace ``module.name`` (Flower's ``pull_objects`` or
    ``pull_and_inflate_object_from_tree`` as that module imported it) by :func:`quick` of it;
    False, with a warning, when this Flower differs from the one it was written for."""
    func = getattr(module, name, None)
    if getattr(func, _MARK, None) is not None:
        func = func.__wrapped__  # wrapped before: wrap Flower's own function again
    problems = check_pull_function(func)
    if problems:
        report_off(log, "%s.%s keeps Flower's 1 s object-pull waits: %s", module.__name__,
                   name, "; ".join(problems))
        return False
    setattr(module, name, quick(func, first_s, cap_s, max_time_s))
    log.debug("%s.%s: object pulls retry after %.3g s, at most %.3g s apart", module.__name__,
              name, first_s, cap_s)
    return True


__all__ = ["CAP_S", "FIRST_S", "KEYWORDS", "check_pull_function", "quick", "quick_pulls"]
