"""HTTPS origins (issue 15): a certificate the daemon does not trust fails visibly, a 502 that
names the cause, at once and never over plain HTTP; trusted through the origin's `ca_file` or
the standard `SSL_CERT_FILE`, the same origin serves verified bytes. Real TLS on loopback: an
aiohttp origin with a certificate made by `openssl`, curl as the loader."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl
from tests.origin_server import OriginServer
from tests.tls import self_signed, server_context


@pytest.fixture
def tls_origin(tmp_path: Path) -> Iterator[tuple[OriginServer, Path]]:
    cert, key = self_signed(tmp_path)
    server = OriginServer(ssl_context=server_context(cert, key))
    server.start()
    yield server, cert
    server.stop()


def test_an_untrusted_certificate_is_a_502_naming_it_and_trust_is_per_origin_or_standard(
    tls_origin: tuple[OriginServer, Path], start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    origin, cert = tls_origin
    data = os.urandom(3 << 20)
    origin.put("s.tar", data)
    config = tmp_path / "c.toml"
    config.write_text(
        f'[origins.untrusted]\nurl = "{origin.url}"\n'
        f'[origins.trusted]\nurl = "{origin.url}"\nca_file = "{cert}"\n'
    )
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")

    started = time.monotonic()
    refused = curl(f"{daemon.url}/untrusted/s.tar", "--no-fail")
    assert refused.status == 502
    assert b"certificate" in refused.body and b"127.0.0.1" in refused.body, refused.body
    assert time.monotonic() - started < 2  # not retried: another try meets the same cert
    assert origin.gets["s.tar"] == 0  # no request reached it, over TLS or in plain text
    assert "certificate verify failed" in daemon.log()
    status = daemon.get_json("/_/status")[1]
    assert status["origins"]["untrusted"]["origin_errors"] == {"tls": 1}  # type: ignore[index]
    assert daemon.metric("shardcache_origin_errors_total", origin="trusted", kind="tls") == 0

    trusted = curl(f"{daemon.url}/trusted/s.tar")
    assert (trusted.exit_code, trusted.sha256) == (0, hashlib.sha256(data).hexdigest())
    assert origin.gets["s.tar"] >= 1

    # The standard variable trusts it for every origin, as for curl and Python.
    other = start_daemon(
        {"plain": origin.url},
        "--readahead",
        "0",
        cache_dir=tmp_path / "other",
        env={"SSL_CERT_FILE": str(cert)},
    )
    result = curl(f"{other.url}/plain/s.tar")
    assert (result.exit_code, result.sha256) == (0, hashlib.sha256(data).hexdigest())


def test_a_ca_file_that_cannot_be_read_is_one_line_at_start(tmp_path: Path) -> None:
    from tests.integration.helpers import run_cli

    config = tmp_path / "c.toml"
    config.write_text(f'[origins.o]\nurl = "https://h/x"\nca_file = "{tmp_path}/missing.pem"\n')
    result = run_cli("serve", "--config", str(config), "--cache-dir", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "ca_file" in result.stderr and "missing.pem" in result.stderr
    assert "Traceback" not in result.stderr
    config.write_text('[origins.o]\nurl = "s3://b"\nca_file = 3\n')
    result = run_cli("serve", "--config", str(config), "--cache-dir", str(tmp_path / "c"))
    assert result.returncode == 2 and "ca_file" in result.stderr
