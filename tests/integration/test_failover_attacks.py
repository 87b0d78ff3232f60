"""A lying mirror attacked from every side (issue 34, item 3): lying while the home is down,
both upstreams lying, a crowd reading one key, and the daemon killed mid-refetch. A client
gets the home's exact bytes or a visible failure; refetches are bounded. Real daemon, real
HTTP upstreams on loopback, curl as the loader, `shardcache verify` on the cache after."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer
from tests.ports import free_port


@pytest.fixture
def servers() -> Iterator[tuple[OriginServer, OriginServer]]:
    liar, home = OriginServer(), OriginServer()
    liar.start()
    home.start()
    yield liar, home
    liar.stop()
    home.stop()


def _lying(
    servers: tuple[OriginServer, OriginServer], tmp_path: Path, size: int, **home_behaviour: object
) -> tuple[bytes, Path]:
    """`k` at the home (honest unless told), and another object's bytes under the home's ETag
    at the mirror, with no checksum; the config that lists the mirror first."""
    liar, home = servers
    data = os.urandom(size)
    home.put("k", data, **home_behaviour)
    liar.put("k", os.urandom(size), claims_etag=home.etags["k"], no_md5=True)
    config = tmp_path / "origins.toml"
    config.write_text(f'[origins.o]\nurls = ["{liar.url}", "{home.url}"]\n')
    return data, config


def _verify(daemon: Daemon) -> dict[str, object]:
    """`shardcache verify --json` of the daemon's cache (asking the daemon while it runs)."""
    command = [sys.executable, "-m", "shardcache", "verify", "--json"]
    command += ["--cache-dir", str(daemon.cache_dir), "--daemon", daemon.url]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


def test_a_mirror_lying_while_the_home_is_down_fails_visibly(
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    _, config = _lying(servers, tmp_path, 1 << 20)
    liar, home = servers
    # Nobody can vouch for the mirror's bytes: the home's port has nothing listening.
    config.write_text(config.read_text().replace(home.url, f"http://127.0.0.1:{free_port()}"))
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")
    reads = [curl(f"{daemon.url}/o/k") for _ in range(3)]
    assert all(r.exit_code != 0 for r in reads), [(r.exit_code, r.status) for r in reads]
    assert _verify(daemon)["entries"] == 0


def test_both_upstreams_lying_fail_every_read_and_refetch_once_per_read(
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    """The home publishes a wrong Content-MD5 as well: every read fails visibly, the fill
    fetched again from the home fails too and starts no third."""
    wrong_md5 = hashlib.md5(b"another object").digest()
    _, config = _lying(servers, tmp_path, 1 << 20, content_md5=wrong_md5)
    liar, home = servers
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")
    reads = [curl(f"{daemon.url}/o/k") for _ in range(4)]
    assert all(r.exit_code != 0 for r in reads), [(r.exit_code, r.status) for r in reads]
    print(f"both lie: home {home.gets['k']} GETs, liar {liar.gets['k']} GETs for 4 reads")
    assert daemon.log().count("fetching it again") == 1  # the liar's fill only, once
    assert liar.gets["k"] == 1 and home.gets["k"] <= len(reads) + 1, (liar.gets, home.gets)
    assert _verify(daemon)["entries"] == 0


def test_a_crowd_on_a_lying_mirror_starts_one_refetch_and_a_kill_leaves_no_entry(
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    """32 readers join the fill from the liar; they all fail visibly and one refetch from
    the home starts. Killed (-9) while that refetch is held: the cache verifies clean, and
    after the restart the reads are the home's bytes."""
    hold = threading.Event()
    data, config = _lying(servers, tmp_path, 5 << 20, hold=hold)
    liar, home = servers
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")
    with ThreadPoolExecutor(32) as pool:
        reads = list(pool.map(lambda _: curl(f"{daemon.url}/o/k"), range(32)))
    expected = hashlib.sha256(data).hexdigest()
    assert all(r.exit_code != 0 or r.sha256 == expected for r in reads)
    wait_for("the refetch", lambda: home.gets["k"] >= 1)
    assert daemon.log().count("fetching it again") == 1
    daemon.stop(signal.SIGKILL)
    hold.set()
    report = _verify(daemon)
    assert report["clean"] and report["entries"] == 0, report
    restarted = start_daemon({}, "--config", str(config), "--readahead", "0")
    after = [curl(f"{restarted.url}/o/k") for _ in range(3)]
    # Its breakers start closed: the first read may be the liar's again, and fail visibly.
    assert all(r.exit_code != 0 or r.sha256 == expected for r in after)
    assert after[-1].exit_code == 0
