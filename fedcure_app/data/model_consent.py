"""Code runs on a client only with its owner's consent.

A task names its model as a built-in (``digits``, ``mnist``, ``cifar10``, ``cnn``, ``mlp``) or
as an import path ``package.module:factory``, which a client imports and calls. A task that
came over the network (the cloud's, at ``Association.Claim``; a ServerApp's run config under
``flwr run``) may name an import path only when the client's owner allowed that exact path:
``fedcure-client --allow-model PATH[,PATH]``, the client's own ``--task`` file naming it, or
the ``allow-model`` node config of a Flower SuperNode. Built-in models need no consent.

Where an import path is looked for is the owner's choice too: the working folder is searched
only by the entry points whose task is the user's own file (``fedcure simulate``/``launch``/
``task``/``testbed``, ``fedcure-cloud --task``: :func:`trust_working_folder`); a client never
searches it (the module must be installed or on ``PYTHONPATH``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Any

from fedcure_app.data.task import _IMPORT_PATH, BUILTIN_TASK_MODELS
from fedcure_app.errors import UsageError

#: the models a client builds without consent
BUILTIN_MODELS: frozenset[str] = frozenset(BUILTIN_TASK_MODELS)

_working_folder_trusted = False


class ModelNotAllowed(UsageError):
    """A task names a model import path its client's owner did not allow (one line)."""

    #: what the client tells the cloud when it withdraws (fedcure_app.protocol.withdraw)
    code = "model-refused"


def trust_working_folder() -> None:
    """Let model import paths name modules in the working folder, as ``python -m`` would:
    for entry points whose task is the user's own file, never for a client."""
    global _working_folder_trusted
    _working_folder_trusted = True


def working_folder_trusted() -> bool:
    """Whether :func:`trust_working_folder` was called in this process."""
    return _working_folder_trusted


def parse_allowed(values: Iterable[str] | str | None) -> frozenset[str]:
    """The import paths of ``--allow-model`` values (each ``PATH[,PATH]``), blanks dropped;
    :class:`UsageError` naming one that is not ``package.module:factory``."""
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    out = set()
    for value in values:
        for path in (p.strip() for p in str(value).split(",")):
            if not path:
                continue
            if not _IMPORT_PATH.match(path):
                raise UsageError(f"--allow-model {path!r}: not an import path "
                                 "package.module:factory")
            out.add(path)
    return frozenset(out)


def check_consent(model: str, allowed: Collection[str], where: str = "the cloud's task") -> None:
    """Nothing when ``model`` is built in or in ``allowed``; else :class:`ModelNotAllowed`
    naming the path and how its owner would allow it."""
    if model in BUILTIN_MODELS or model in allowed:
        return
    raise ModelNotAllowed(f"{where} names the model import path {model!r}, which this client "
                          f"does not run without its owner's consent: allow it with "
                          f"--allow-model {model} (or a --task file of your own naming it)")


def own_clients_consent(task: Any, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """For clients this machine's user starts under its own ``task`` (``fedcure launch``):
    the ``fedcure-client`` options that allow its model (none for a built-in) and ``env``
    with the working folder on ``PYTHONPATH``, so that they find the model where this
    command does (explicitly: a client never searches its working folder by itself)."""
    if task is None or task.model in BUILTIN_MODELS:
        return [], env
    path = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    return ["--allow-model", task.model], {**env, "PYTHONPATH": path}


__all__ = ["BUILTIN_MODELS", "ModelNotAllowed", "check_consent", "own_clients_consent",
           "parse_allowed",
           "trust_working_folder", "working_folder_trusted"]
