"""The cloud controller's refusal: a reason and a one-line message, no transport attached.

The controller and the run loop (:mod:`cloud_server.controller`, :mod:`cloud_server.runloop`)
raise :class:`Refusal`; the gRPC servicer turns it into the status code of the same name
(``cloud_server.errors.CloudError.of``).
"""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    """Why a request is refused; each name is the gRPC status code it maps to."""

    INVALID_ARGUMENT = "the request is malformed or out of bounds"
    NOT_FOUND = "it names something the cloud does not know"
    ALREADY_EXISTS = "what it asks for is held by someone else"
    FAILED_PRECONDITION = "the cloud is not in a state that allows it"
    RESOURCE_EXHAUSTED = "nothing is left to give"
    UNAVAILABLE = "try again later (nothing changed)"
    ABORTED = "a newer call replaced this one"
    DEADLINE_EXCEEDED = "the wait ran out; ask again"
    UNAUTHENTICATED = "wrong or missing credential"
    PERMISSION_DENIED = "the credential does not allow it"


class Refusal(Exception):
    """A request the cloud refuses: ``reason`` and a one-line ``message``."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


__all__ = ["Reason", "Refusal"]
