"""Flower SuperNode authentication for the edge servers' SuperLinks.

An ES started with ``--supernode-auth`` runs its SuperLink with ``--enable-supernode-auth``
(Flower's CLI-managed mode, TLS required): only SuperNodes whose public key was registered
(``flwr supernode register``) may connect. The keys travel through the cloud:

1. a client makes a P-384 key pair (:func:`make_supernode_keys`) and sends the public key with
   ``Association.Register``;
2. its ES asks the cloud for its members (``EdgeLink.Members``) every second and registers every
   new key with its own SuperLink (:func:`register_supernode_key`);
3. the client starts ``flower-supernode --auth-supernode-private-key``; a SuperNode that starts
   before its key is registered is refused (Flower's exit code 305) and the client starts it
   again.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

#: the longest public key text accepted (an OpenSSH P-521 key is ~270 characters)
MAX_KEY_CHARS = 2048

#: what a SuperNode its SuperLink refused (key not registered) logs before it exits: Flower's
#: exit code 305 (the process itself exits with status 1)
REFUSED_MARKERS = ("Exit Code: 305", "Failed to activate SuperNode")


def refused(log_text: str) -> bool:
    """Whether a SuperNode's log says its SuperLink refused it (key not registered)."""
    return any(marker in log_text for marker in REFUSED_MARKERS)


def make_supernode_keys(directory: str | Path) -> tuple[Path, Path]:
    """Write a new P-384 key pair into ``directory``: ``supernode.key`` (OpenSSH private key,
    mode 0600) and ``supernode.pub`` (OpenSSH public key); return their paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = d / "supernode.key"
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                  serialization.NoEncryption()))
    public = d / "supernode.pub"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def check_supernode_key(text: str) -> None:
    """Raise ValueError unless ``text`` is an OpenSSH elliptic-curve public key."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    if len(text) > MAX_KEY_CHARS:
        raise ValueError(f"supernode_public_key is longer than {MAX_KEY_CHARS} characters")
    try:
        key = load_ssh_public_key(text.strip().encode())
    except (ValueError, TypeError, UnicodeError, UnsupportedAlgorithm) as err:
        raise ValueError(f"supernode_public_key is not an OpenSSH public key ({err})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("supernode_public_key must be an elliptic-curve (NIST P-256/384/521) key")


class RegistrationError(RuntimeError):
    """``flwr supernode register`` failed (one line)."""


def register_supernode_key(key_text: str, key_file: str | Path, *, connection: str,
                           env: dict[str, str], flwr_bin: str = "flwr",
                           timeout_s: float = 60.0) -> int | None:
    """Register one SuperNode public key with a SuperLink through ``flwr supernode register``
    (``connection`` names the SuperLink in ``$FLWR_HOME/config.toml`` of ``env``).

    Returns the node id Flower assigned, or None when the key was registered before."""
    check_supernode_key(key_text)
    path = Path(key_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(key_text.strip() + "\n")
    try:
        done = subprocess.run([flwr_bin, "supernode", "register", str(path), connection,
                               "--format", "json"], capture_output=True, text=True,
                              env=env, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RegistrationError(f"flwr supernode register could not run: {err}") from None
    try:
        reply = json.loads(done.stdout[done.stdout.find("{"):])
    except ValueError:
        raise RegistrationError(f"flwr supernode register gave no JSON (exit {done.returncode}):"
                                f" {(done.stdout + done.stderr).strip()[-300:]}") from None
    if reply.get("success"):
        return int(reply["node-id"])
    message = str(reply.get("error-message", ""))
    if "already in use" in message:
        return None
    raise RegistrationError(f"flwr supernode register failed: {message.strip()[-300:]}")


__all__ = ["MAX_KEY_CHARS", "REFUSED_MARKERS", "RegistrationError", "check_supernode_key",
           "make_supernode_keys", "refused", "register_supernode_key"]
