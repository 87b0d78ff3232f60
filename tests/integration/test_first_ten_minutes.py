"""What a new user met in the first ten minutes (issue 11), each as the user met it."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

from tests.daemon_process import Daemon
from tests.origin_server import OriginServer

SHARD = os.urandom(24 << 20)


def _wait_for(what: str, predicate, timeout_s: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_reader_that_leaves_early_is_a_499_and_the_fill_goes_on(
    origin: OriginServer, start_daemon
) -> None:
    """The README's first try, `curl -sf URL | tar t | head`, stops reading a miss early."""
    origin.put("shards_000.tar", SHARD)
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    subprocess.run(
        f"curl -sf {daemon.url}/web/shards_000.tar | head -c 1000 > /dev/null",
        shell=True,
        check=False,
        timeout=60,
    )
    log = daemon.wait_for_log("GET /web/shards_000.tar 499 miss")
    assert "Traceback" not in log and "unhandled error" not in log and " 500 " not in log
    assert daemon.metric("shardcache_client_disconnects_total", origin="web") == 1
    _wait_for("the fill to finish", lambda: daemon.get_json("/_/status")[1]["cache"]["entries"])
    with urllib.request.urlopen(daemon.url + "/web/shards_000.tar", timeout=30) as response:
        assert response.headers["X-Shardcache"] == "hit" and response.read() == SHARD
    assert origin.gets["shards_000.tar"] >= 1
