"""What an edge's credentials look like, for the command that issues them (``fedcure certs
--edges M``) and the cloud that checks them (:mod:`cloud_server.identity`).

- a client certificate whose common name is :func:`edge_common_name` (``fedcure-edge-<m>``,
  matched by :data:`EDGE_CN`) identifies edge m under mutual TLS;
- a per-edge token from :func:`new_edge_tokens` (256 random bits, URL-safe text) identifies
  edge m on the EdgeLink RPCs.
"""

from __future__ import annotations

import re
import secrets

#: The common name of an edge certificate; group 1 is the edge id.
EDGE_CN = re.compile(r"^fedcure-edge-(\d{1,6})$")


def edge_common_name(m: int) -> str:
    """The certificate common name that identifies edge m."""
    return f"fedcure-edge-{int(m)}"


def new_edge_tokens(num_edges: int) -> dict[int, str]:
    """A fresh random token (256 bits, URL-safe text) per edge id."""
    if num_edges < 1:
        raise ValueError(f"--edges must be >= 1, got {num_edges}")
    return {m: f"edge{m}-{secrets.token_urlsafe(32)}" for m in range(num_edges)}


__all__ = ["EDGE_CN", "edge_common_name", "new_edge_tokens"]
