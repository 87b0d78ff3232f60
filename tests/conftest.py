"""Shared fixtures: a real HTTP origin, real S3 servers (moto and SeaweedFS), and the daemon as
users start it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardcache.origins.receivers import ReceiverPool
from tests.daemon_process import Daemon
from tests.origin_server import OriginServer
from tests.s3_stores import STORES, S3Store, client_for, env_for, moto_server, seaweedfs_server


@pytest.fixture
def origin() -> Iterator[OriginServer]:
    server = OriginServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server process for the session."""
    with moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def seaweedfs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SeaweedFS process (`weed server -s3`) for the session, started on first use."""
    directory = tmp_path_factory.mktemp("seaweedfs")
    with seaweedfs_server(directory) as url:
        yield url
    # The store's volumes hold every S3 test's uploads: not kept after a failed run either
    # (the failing test's own tmp_path is).
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=STORES)
def s3_store(request: pytest.FixtureRequest) -> S3Store:
    """Each S3 test runs over every store (ids `moto`, `seaweedfs`); a test that makes sense on
    one only says why and parametrizes `s3_store` indirectly with that one."""
    name = str(request.param)
    return S3Store(name, request.getfixturevalue(f"{name}_endpoint"))


@pytest.fixture
def s3_endpoint(s3_store: S3Store) -> str:
    """The store's endpoint, reached through boto3's ordinary endpoint settings."""
    return s3_store.endpoint


@pytest.fixture
def s3_env(s3_endpoint: str) -> dict[str, str]:
    return env_for(s3_endpoint)


@pytest.fixture
def s3_client(s3_endpoint: str):  # type: ignore[no-untyped-def]
    return client_for(s3_endpoint)


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


@pytest.fixture
def receiver_pool() -> Iterator[ReceiverPool]:
    """One receiving process, as the daemon passes its pool to every transport it builds:
    started and answering before the test (as the daemon waits before it listens, so a short
    read timeout never covers a receiver's imports); killed at the end."""
    pool = ReceiverPool(1)
    pool.start()
    assert pool.wait_started(60) == 0, "the receiving process did not answer in 60 s"
    yield pool
    pool.kill_all()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loopback only: never send test traffic through a proxy from the environment.
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
