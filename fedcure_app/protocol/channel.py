"""Client side of the cloud's gRPC link: one way to open a channel, TLS by default.

Edge servers and clients call :func:`open_channel`. With ``tls_ca`` the server certificate is
checked against that CA (PEM file); without it, against the system roots. ``tls_cert`` +
``tls_key`` add a client certificate (mutual TLS). ``insecure=True`` opens a plaintext channel
and logs a warning; it cannot be combined with TLS files.

    ch = open_channel("cloud:9090", tls_ca="certs/ca.crt")
    ch = open_channel("127.0.0.1:9090", insecure=True)

A channel whose security does not match the server's never becomes ready, and gRPC says only
"Deadline Exceeded" when the caller's wait runs out. :func:`check_security` waits a few seconds
for the channel; when it is not ready it asks the server what it speaks (:func:`probe_server`:
one TLS handshake, one HTTP/2 preface, no RPC) and raises :class:`ChannelSecurityError` with one
line naming both sides and the option that fixes it. Clients and edges call it right after
:func:`open_channel`; :func:`security_mismatch` is the same diagnosis for an RPC that failed.
"""

from __future__ import annotations

import logging
import socket
import ssl
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


class ChannelSecurityError(ChannelConfigError):
    """This side's TLS settings do not match what the server speaks (one-line message)."""


#: the HTTP/2 client preface and an empty SETTINGS frame: a plaintext gRPC server answers
#: with its own SETTINGS frame (frame type 0x04 in byte 3 of the 9-byte frame header)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _speaks_h2(host: str, port: int, timeout_s: float) -> bool | None:
    """True: the server answered the HTTP/2 preface in plaintext; None: no connection."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None
    with sock:
        try:
            sock.sendall(_H2_PREFACE)
            head = sock.recv(9)
        except OSError:  # reset, or no answer in time
            return False
    return len(head) >= 4 and head[3] == 0x04


def _tls_handshake(host: str, port: int, timeout_s: float, *, verify: bool,
                   ca: str | Path | None = None, server_name: str | None = None) -> str | None:
    """None when a TLS handshake succeeds; otherwise why not (``ssl``'s words)."""
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            with ctx.wrap_socket(sock, server_hostname=server_name or host):
                return None
    except ssl.SSLCertVerificationError as err:
        return f"certificate verify failed: {err.verify_message}"
    except (ssl.SSLError, OSError) as err:
        return str(getattr(err, "reason", None) or err)


def probe_server(address: str, timeout_s: float = 2.0) -> str | None:
    """What the server at ``address`` speaks: ``"tls"``, ``"plaintext"`` (HTTP/2 in clear, as
    a ``--insecure`` server), or None (nothing listens, or neither answer came in time)."""
    host, port = _host_port(address)
    if _tls_handshake(host, port, timeout_s, verify=False) is None:
        return "tls"
    if _speaks_h2(host, port, timeout_s):
        return "plaintext"
    return None


def security_mismatch(address: str, *, insecure: bool, tls_ca: str | Path | None = None,
                      server_name: str | None = None, role: str = "client",
                      timeout_s: float = 2.0) -> str | None:
    """One line saying how this side's security differs from the server's, with the option that
    fixes it; None when the server is not reachable or the two sides agree (as far as a probe
    without this side's client certificate can tell)."""
    spoken = probe_server(address, timeout_s)
    if spoken is None:
        return None
    if insecure and spoken == "tls":
        return (f"the cloud at {address} speaks TLS but this {role} connects in plaintext "
                "(--insecure): drop --insecure and pass --tls-ca FILE (the CA that signed the "
                "cloud's certificate)")
    if not insecure and spoken == "plaintext":
        return (f"the cloud at {address} speaks plaintext (it runs with --insecure) but this "
                f"{role} connects with TLS: add --insecure to this {role} too, or start the "
                "cloud with --tls-cert/--tls-key")
    if not insecure:
        host, port = _host_port(address)
        why = _tls_handshake(host, port, timeout_s, verify=True, ca=tls_ca,
                             server_name=server_name)
        if why and why.startswith("certificate verify failed"):
            against = f"--tls-ca {tls_ca}" if tls_ca else "the system's CA roots (no --tls-ca)"
            return (f"the cloud at {address} speaks TLS but its certificate does not verify "
                    f"against {against} ({why[len('certificate verify failed: '):]}): pass "
                    "--tls-ca with the CA that signed the cloud's certificate")
    return None


def check_security(channel: grpc.Channel, address: str, *, insecure: bool,
                   tls_ca: str | Path | None = None, server_name: str | None = None,
                   role: str = "client", wait_s: float = 3.0) -> None:
    """Return once ``channel`` is ready, or after ``wait_s`` seconds when the server is not up
    yet; raise :class:`ChannelSecurityError` when it is up and speaks another security."""
    try:
        grpc.channel_ready_future(channel).result(timeout=wait_s)
        return
    except grpc.FutureTimeoutError:
        pass
    why = security_mismatch(address, insecure=insecure, tls_ca=tls_ca, server_name=server_name,
                            role=role)
    if why:
        raise ChannelSecurityError(why)


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


__all__ = ["ChannelConfigError", "ChannelSecurityError", "channel_credentials",
           "check_security", "open_aio_channel", "open_channel", "probe_server", "read_pem",
           "security_mismatch"]
