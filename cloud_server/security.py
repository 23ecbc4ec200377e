"""Server-side transport security for the cloud's gRPC service.

:func:`server_credentials` builds ``grpc.ssl_server_credentials`` from PEM files: TLS with the
server certificate and key, and mutual TLS (client certificates required and checked against
``client_ca``) when a client CA is given. :func:`transport_from_flags` turns the CLI flags into
credentials or ``None`` (plaintext, only with ``--insecure``, with a warning).

The shared token (``--token`` / ``$FEDCURE_TOKEN``) is checked by the service, in constant time
(:func:`token_ok`), on every RPC except ``Monitor.Status``: Register and Claim (clients), and
Connect, Submit, Members, Progress and Evaluated (edges) unless per-edge credentials replace it
for the edges
(``cloud_server.identity``: per-edge tokens, or edge client certificates under mutual TLS).

``Monitor.Status`` answers without a token so that healthchecks (``fedcure-healthcheck``) need no
secret (under mutual TLS the caller still needs a client certificate from the CA). It reveals
only the phase, the global version and round, the configured number of rounds, how many clients
registered (of how many expected), how many edges are connected (of how many), the ids of the
coalitions training now and, per such coalition, its edge round, the numeric ids of the clients
it still waits for, elapsed time and ETA: no client names, addresses, models, metrics or
tokens.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

import grpc

from fedcure_app.protocol.channel import ChannelConfigError, read_pem

log = logging.getLogger("fedcure.cloud.security")


class SecurityConfigError(ValueError):
    """Bad combination of the cloud's security flags (one-line message)."""


def server_credentials(cert: str | Path, key: str | Path,
                       client_ca: str | Path | None = None) -> grpc.ServerCredentials:
    """TLS server credentials; mutual TLS (client certificate required) with ``client_ca``."""
    try:
        cert_pem = read_pem(cert, "server certificate")
        key_pem = read_pem(key, "server key")
        ca_pem = read_pem(client_ca, "client CA certificate")
    except ChannelConfigError as err:
        raise SecurityConfigError(str(err)) from None
    assert cert_pem is not None and key_pem is not None
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)],
        root_certificates=ca_pem,
        require_client_auth=ca_pem is not None,
    )


def transport_from_flags(*, insecure: bool, tls_cert: str | None, tls_key: str | None,
                         tls_client_ca: str | None, enforce: bool = True
                         ) -> grpc.ServerCredentials | None:
    """Credentials for the flags, or None for plaintext.

    Plaintext needs ``insecure`` (else :class:`SecurityConfigError` when ``enforce``; a warning
    otherwise); ``--insecure`` with TLS files, or a certificate without its key, is an error.
    """
    if insecure and (tls_cert or tls_key or tls_client_ca):
        raise SecurityConfigError("--insecure cannot be combined with --tls-cert/--tls-key/"
                                  "--tls-client-ca")
    if bool(tls_cert) != bool(tls_key):
        raise SecurityConfigError("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        raise SecurityConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    if tls_cert and tls_key:
        return server_credentials(tls_cert, tls_key, tls_client_ca)
    if not insecure and enforce:
        raise SecurityConfigError(
            "no TLS certificate given: pass --tls-cert FILE --tls-key FILE (see `fedcure certs`)"
            " or --insecure to serve plaintext")
    return None


def describe_transport(*, insecure: bool, tls_cert: str | None, tls_client_ca: str | None
                       ) -> tuple[int, str]:
    """(log level, message) saying how the cloud serves, for the line after it is bound."""
    if tls_cert:
        return logging.INFO, "TLS" + (" with mutual authentication (client certificates "
                                      "required)" if tls_client_ca else "")
    return logging.WARNING, ("WITHOUT TLS" + (" (--insecure)" if insecure else
                                              " (no --tls-cert; pass --insecure to confirm)")
                             + ": traffic and token travel in clear text")


def token_ok(expected: str, given: str) -> bool:
    """True when no token is required or ``given`` equals it (constant-time comparison)."""
    if not expected:
        return True
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8"))


__all__ = ["SecurityConfigError", "describe_transport", "server_credentials", "token_ok", "transport_from_flags"]
