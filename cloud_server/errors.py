"""The cloud's refusal type: a gRPC status code and a one-line reason of bounded length."""

from __future__ import annotations

import grpc

from cloud_server.refusal import Refusal

#: longest reason sent back (gRPC metadata must stay small; never echo a whole request)
MAX_DETAIL = 400


class CloudError(Exception):
    """An RPC refused with a gRPC status code and a one-line reason (cut to MAX_DETAIL)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        line = message.splitlines()[0] if message else code.name
        if len(line) > MAX_DETAIL:
            line = line[: MAX_DETAIL - 1] + "…"
        super().__init__(line)
        self.code = code
        self.message = line

    @classmethod
    def of(cls, refusal: Refusal) -> "CloudError":
        """The controller's domain refusal as the gRPC status code of the same name."""
        return cls(grpc.StatusCode[refusal.reason.name], refusal.message)


__all__ = ["CloudError", "MAX_DETAIL"]
