"""Shared fixtures: a real HTTP origin, a real moto S3 server, and the daemon as users start it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.origin_server import OriginServer
from tests.ports import free_port


@pytest.fixture
def origin() -> Iterator[OriginServer]:
    server = OriginServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server process, reached through boto3's ordinary endpoint settings."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("moto server did not start") from None
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(10)


@pytest.fixture
def s3_env(s3_endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }


@pytest.fixture
def s3_client(s3_env: dict[str, str]):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons on free ports; each is stopped with SIGTERM and must exit 0."""
    started: list[Daemon] = []

    def start(
        origins: dict[str, str], *extra: str, cache_dir: Path | None = None, **kwargs: object
    ) -> Daemon:
        daemon = Daemon(cache_dir or tmp_path / "cache", origins, *extra, **kwargs)  # type: ignore[arg-type]
        started.append(daemon)
        return daemon

    yield start
    running = [d for d in started if d.process.poll() is None]
    for daemon in started:  # also closes the logs of daemons a test stopped itself
        code = daemon.stop()
        assert daemon not in running or code == 0, f"daemon exited {code}:\n{daemon.log()}"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loopback only: never send test traffic through a proxy from the environment.
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
