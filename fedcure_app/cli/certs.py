"""``fedcure certs``: a private CA, a server certificate and a client certificate for local set-ups.

    fedcure certs --out certs [--hosts cloud,edge0,edge1,localhost,127.0.0.1] [--days 365]
                  [--edges M]

Writes ``ca.crt``/``ca.key`` (the CA), ``server.crt``/``server.key`` (one server certificate whose
subject alternative names cover every host: DNS names, and IP addresses for literal IPs) and
``client.crt``/``client.key`` (a client certificate for mutual TLS). Keys are ECDSA P-256, PEM,
written with mode 0600. Existing files are not overwritten unless ``--force``.

With ``--edges M`` it also issues each edge its own identity (``cloud_server.identity``):
``edge-<m>.crt``/``edge-<m>.key`` (client certificate, common name ``fedcure-edge-<m>``, for
``fedcure-cloud --edge-certs`` under mutual TLS), ``edge-<m>.token`` (the edge's ``--token``) and
``edge-tokens.json`` (every edge's token, for ``fedcure-cloud --edge-tokens``; mode 0600).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("fedcure.certs")

DEFAULT_HOSTS = "cloud,edge0,edge1,localhost,127.0.0.1"
FILES = ("ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "certs",
        help="write a private CA, a server and a client certificate (TLS / mutual TLS)",
        description="Create ca.crt/ca.key, server.crt/server.key (SANs: every --hosts entry) "
        "and client.crt/client.key in --out, for fedcure-cloud --tls-* and the roles' --tls-*.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the files to")
    p.add_argument("--hosts", default=DEFAULT_HOSTS, metavar="H1,H2,...",
                   help=f"comma-separated host names / IPs the server certificate covers "
                        f"(default {DEFAULT_HOSTS})")
    p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    p.add_argument("--client-name", default="fedcure-client",
                   help="common name of the client certificate (default fedcure-client)")
    p.add_argument("--edges", type=int, default=0, metavar="M",
                   help="also issue edges 0..M-1 their own certificate and token (default 0)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=run)


def parse_hosts(text: str) -> list[str]:
    """Split ``a,b, c`` into host names; ValueError when empty or malformed."""
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise ValueError("--hosts needs at least one host name or IP address")
    for h in hosts:
        if any(ch.isspace() for ch in h) or "/" in h:
            raise ValueError(f"--hosts: {h!r} is not a host name or IP address")
    return hosts


def _san(hosts: list[str]) -> Any:
    from cryptography import x509

    names: list[Any] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FedCure local"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_certificates(hosts: list[str], days: int = 365, client_name: str = "fedcure-client",
                      edges: int = 0) -> dict[str, bytes]:
    """PEM bytes of the six files, plus each edge's certificate, key and token with ``edges``
    (see the module docstring), keyed by file name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if days < 1:
        raise ValueError(f"--days must be >= 1, got {days}")
    if not 0 <= edges <= 10_000:
        raise ValueError(f"--edges must be in [0, 10000], got {edges}")
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    ca_key = _key()
    ca_name = _name("FedCure local CA")
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: Any, san: Any | None) -> tuple[Any, Any]:
        key = _key()
        b = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
        )
        if san is not None:
            b = b.add_extension(san, critical=False)
        return b.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, _san(hosts))
    client, client_key = leaf(client_name, ExtendedKeyUsageOID.CLIENT_AUTH,
                              _san([client_name]))

    def cert_pem(c: Any) -> bytes:
        return c.public_bytes(serialization.Encoding.PEM)

    def key_pem(k: Any) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    out = {
        "ca.crt": cert_pem(ca), "ca.key": key_pem(ca_key),
        "server.crt": cert_pem(server), "server.key": key_pem(server_key),
        "client.crt": cert_pem(client), "client.key": key_pem(client_key),
    }
    if edges:
        import json

        from fedcure_app.protocol.edge_identity import edge_common_name, new_edge_tokens

        tokens = new_edge_tokens(edges)
        for m, token in tokens.items():
            cn = edge_common_name(m)
            cert, key = leaf(cn, ExtendedKeyUsageOID.CLIENT_AUTH, _san([cn]))
            out[f"edge-{m}.crt"], out[f"edge-{m}.key"] = cert_pem(cert), key_pem(key)
            out[f"edge-{m}.token"] = (token + "\n").encode()
        out["edge-tokens.json"] = json.dumps({str(m): t for m, t in tokens.items()},
                                             indent=1).encode()
    return out


def write_certificates(out: str | Path, hosts: list[str], *, days: int = 365,
                       client_name: str = "fedcure-client", force: bool = False,
                       edges: int = 0) -> list[Path]:
    """Create the files in ``out`` (keys and tokens mode 0600); the written paths."""
    out = Path(out)
    names = list(FILES) + ["edge-tokens.json"] * bool(edges) + [
        f"edge-{m}.{ext}" for m in range(edges) for ext in ("crt", "key", "token")]
    existing = [f for f in names if (out / f).exists()]
    if existing and not force:
        raise ValueError(f"{out} already holds {', '.join(existing[:6])}; pass --force to "
                         "overwrite")
    files = make_certificates(hosts, days, client_name, edges)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = out / name
        tmp = out / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600 if name.endswith((".key", ".token", "tokens.json")) else 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    hosts = parse_hosts(args.hosts)
    paths = write_certificates(args.out, hosts, days=args.days, client_name=args.client_name,
                               force=args.force, edges=args.edges)
    shown = [p.name for p in paths if not p.name.startswith("edge-")]
    print(f"wrote {', '.join(shown)} to {args.out} "
          f"(server certificate for {', '.join(hosts)}; valid {args.days} days)")
    if args.edges:
        print(f"and for edges 0..{args.edges - 1}: edge-<m>.crt/.key (CN fedcure-edge-<m>), "
              "edge-<m>.token (the edge's --token) and edge-tokens.json (fedcure-cloud "
              "--edge-tokens)")
    return 0
