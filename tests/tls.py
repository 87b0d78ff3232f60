"""HTTPS test origins: the benchmarks' self-signed certificate (real `openssl`), served."""

from __future__ import annotations

import ssl
from pathlib import Path

from benchmarks.peers import self_signed

__all__ = ["self_signed", "server_context"]


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
