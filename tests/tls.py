"""Self-signed certificates for HTTPS test origins, made with the real `openssl` command."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key; (cert, key) paths."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed for the TLS tests (scripts/test installs it)"
    cert, key = directory / "origin-cert.pem", directory / "origin-key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=shardcache test origin",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
