"""Client side of the cloud's gRPC link: one way to open a channel, TLS by default.

Edge servers and clients call :func:`open_channel`. With ``tls_ca`` the server certificate is
checked against that CA (PEM file); without it, against the system roots. ``tls_cert`` +
``tls_key`` add a client certificate (mutual TLS). ``insecure=True`` opens a plaintext channel
and logs a warning; it cannot be combined with TLS files.

    ch = open_channel("cloud:9090", tls_ca="certs/ca.crt")
    ch = open_channel("127.0.0.1:9090", insecure=True)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc

from fedcure_app.protocol.wire import GRPC_OPTIONS

log = logging.getLogger("fedcure.channel")

#: reconnect quickly after the cloud restarts (gRPC's default back-off grows to 120 s)
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 5000),
]


class ChannelConfigError(ValueError):
    """Bad combination of channel security options (one-line message)."""


def read_pem(path: str | Path | None, what: str) -> bytes | None:
    """The bytes of a PEM file, or None for None; one-line ``ChannelConfigError`` otherwise."""
    if path is None or path == "":
        return None
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise ChannelConfigError(f"cannot read {what} {p}: {err.strerror or err}") from None
    if b"-----BEGIN" not in data:
        raise ChannelConfigError(f"{what} {p} is not a PEM file")
    return data


def channel_credentials(*, tls_ca: str | Path | None = None, tls_cert: str | Path | None = None,
                        tls_key: str | Path | None = None) -> grpc.ChannelCredentials:
    """``grpc.ssl_channel_credentials`` from PEM files (mutual TLS when cert and key given)."""
    if (tls_cert is None) != (tls_key is None):
        raise ChannelConfigError("--tls-cert and --tls-key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls_ca, "CA certificate"),
        private_key=read_pem(tls_key, "private key"),
        certificate_chain=read_pem(tls_cert, "certificate"),
    )


def open_channel(address: str, *, tls_ca: str | Path | None = None,
                 tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                 insecure: bool = False, options: list[tuple[str, Any]] | None = None,
                 server_name: str | None = None) -> grpc.Channel:
    """A synchronous gRPC channel to the cloud at ``address`` (host:port).

    ``server_name`` overrides the host name the server certificate must carry (useful when
    connecting by IP to a certificate issued for a name). Raises :class:`ChannelConfigError`.
    """
    opts = list(GRPC_OPTIONS if options is None else options) + RECONNECT_OPTIONS
    if insecure:
        if tls_ca or tls_cert or tls_key:
            raise ChannelConfigError("--insecure cannot be combined with --tls-* files")
        log.warning("connecting to %s WITHOUT TLS (--insecure): traffic and token are "
                    "sent in clear text", address)
        return grpc.insecure_channel(address, options=opts)
    creds = channel_credentials(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(address, creds, options=opts)


def open_aio_channel(address: str, *, tls_ca: str | Path | None = None,
                     tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                     insecure: bool = False, options: list[tuple[str, Any]] | None = None,
                     server_name: str | None = None) -> grpc.aio.Channel:
    """The ``grpc.aio`` twin of :func:`open_channel` (same arguments and checks)."""
    opts = list(GRPC_OPTIONS if options is None else options) + RECONNECT_OPTIONS
    if insecure:
        if tls_ca or tls_cert or tls_key:
            raise ChannelConfigError("--insecure cannot be combined with --tls-* files")
        log.warning("connecting to %s WITHOUT TLS (--insecure)", address)
        return grpc.aio.insecure_channel(address, options=opts)
    creds = channel_credentials(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, creds, options=opts)


__all__ = ["ChannelConfigError", "channel_credentials", "open_aio_channel", "open_channel",
           "read_pem"]
