"""Edge identity bound to a credential: an edge may act only as itself.

Two credentials bind a caller to one edge id m:

- a **per-edge token** (``fedcure certs --edges M`` writes ``edge-tokens.json`` for the cloud,
  ``--edge-tokens FILE``, and ``edge-<m>.token`` for edge m, ``--token``). With per-edge tokens
  the EdgeLink RPCs (Connect, Submit, Members, Progress, Evaluated) take edge m's token only
  for edge m: another edge's token gets PERMISSION_DENIED, an unknown one UNAUTHENTICATED; the
  shared token is then for clients (Association) only;
- a **client certificate** under mutual TLS whose common name is ``fedcure-edge-<m>`` (issued by
  ``fedcure certs --edges M``): such a peer may only act as edge m (PERMISSION_DENIED otherwise).
  With ``require_certs`` every EdgeLink caller must present one.

Without either, any holder of the shared token may act as any edge (the old behaviour; the
cloud logs a warning at start).
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

import grpc

from cloud_server.errors import CloudError
from fedcure_app.protocol.edge_identity import EDGE_CN, edge_common_name, new_edge_tokens


def load_edge_tokens(path: str | Path) -> dict[int, str]:
    """Read ``{"0": "token", ...}`` (edge id -> token); ValueError with one line when bad."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read edge tokens {path}: {err}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a JSON object edge id -> token")
    out: dict[int, str] = {}
    for k, v in data.items():
        if not str(k).isdigit() or not isinstance(v, str) or len(v) < 16:
            raise ValueError(f"{path}: entry {str(k)[:20]!r} must map an edge id to a token of "
                             "at least 16 characters")
        out[int(k)] = v
    if len(set(out.values())) != len(out):
        raise ValueError(f"{path}: two edges share a token")
    return out


def peer_edge(context: Any) -> int | None:
    """The edge id a mutual-TLS peer's certificate names (CN ``fedcure-edge-<m>``), else None."""
    if context is None:
        return None
    try:
        auth = context.auth_context() or {}
    except Exception:  # noqa: BLE001 - contexts without TLS information
        return None
    for cn in auth.get("x509_common_name", []):
        match = EDGE_CN.match(cn.decode("utf-8", "replace") if isinstance(cn, bytes) else cn)
        if match:
            return int(match.group(1))
    return None


class EdgeCredentials:
    """Which credentials may act as which edge (see the module docstring)."""

    def __init__(self, tokens: dict[int, str] | None = None, *, require_certs: bool = False
                 ) -> None:
        self.tokens = dict(tokens or {})
        self.require_certs = bool(require_certs)

    @property
    def bound(self) -> bool:
        """True when edge ids are bound to credentials at all."""
        return bool(self.tokens) or self.require_certs

    def check(self, m: int, token: str, context: Any, shared_ok: bool) -> None:
        """Raise :class:`CloudError` unless the caller may act as edge ``m``.

        ``shared_ok``: the request carries the valid shared token (what counts without
        per-edge tokens; an edge certificate then binds the id on top of it).
        """
        if self.tokens:
            mine = self.tokens.get(m, "")
            if not (mine and hmac.compare_digest(mine.encode(), token.encode())):
                other = any(hmac.compare_digest(t.encode(), token.encode())
                            for e, t in self.tokens.items() if e != m)
                if other:
                    raise CloudError(grpc.StatusCode.PERMISSION_DENIED,
                                     f"this credential belongs to another edge, not edge {m}")
                raise CloudError(grpc.StatusCode.UNAUTHENTICATED,
                                 f"wrong or missing token for edge {m}")
        elif not shared_ok:
            raise CloudError(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing token")
        who = peer_edge(context)
        if who is not None and who != m:
            raise CloudError(grpc.StatusCode.PERMISSION_DENIED,
                             f"the client certificate names edge {who}, not edge {m}")
        if who is None and self.require_certs:
            raise CloudError(grpc.StatusCode.PERMISSION_DENIED,
                             f"edge {m} must present its client certificate "
                             f"(CN {edge_common_name(m)})")


__all__ = ["EdgeCredentials", "edge_common_name", "load_edge_tokens", "new_edge_tokens",
           "peer_edge"]
