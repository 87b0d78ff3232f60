"""Mid-body failures: resume with Range, abort the client when retries run out, never cache."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import threading
import time

from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer


def test_mid_body_failure_resumes_with_range(origin: OriginServer, start_daemon) -> None:
    data = os.urandom(4 * 1024 * 1024)
    some_bytes_on_disk = threading.Event()
    origin.put("s.tar", data, cut_after=1_500_000, cuts=1, before_cut=some_bytes_on_disk)
    daemon = start_daemon({"web": origin.url})
    results = []
    worker = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s.tar")))
    worker.start()
    # Cut the connection only once the fill has written bytes, so there is something to resume.
    partial = daemon.cache_dir / "v1" / "partial"
    wait_for("the fill's first bytes", lambda: any(p.stat().st_size for p in partial.iterdir()))
    some_bytes_on_disk.set()
    worker.join(60)
    (result,) = results

    assert result.exit_code == 0 and result.sha256 == sha256(data)
    starts = sorted(int(r.removeprefix("bytes=").split("-")[0]) for _, r in origin.ranges)
    resumed = [s for s in starts if 0 < s <= 1_500_000]  # the first segment, resumed mid-way
    assert starts[0] == 0 and len(resumed) == 1, origin.ranges
    assert curl(f"{daemon.url}/web/s.tar").headers["x-shardcache"] == "hit"
    assert daemon.metric("shardcache_origin_retries_total", origin="web") == 1


def test_failure_after_retries_aborts_client_and_is_not_cached(
    origin: OriginServer, start_daemon
) -> None:
    data = os.urandom(2 * 1024 * 1024)
    origin.put("s.tar", data, cut_after=1_000_000, cuts=100)
    daemon = start_daemon({"web": origin.url}, "--origin-retries", "2")

    result = curl(f"{daemon.url}/web/s.tar")

    assert result.exit_code != 0, "a short body must be a failed transfer"
    assert len(result.body) < len(data)
    assert origin.gets["s.tar"] == 3  # the first try and two resumes
    origin.behaviour["s.tar"].cuts = 0
    again = curl(f"{daemon.url}/web/s.tar")
    assert again.headers["x-shardcache"] == "miss" and again.sha256 == sha256(data)


def test_wrong_checksum_is_never_served_complete_or_cached(
    origin: OriginServer, start_daemon
) -> None:
    data = os.urandom(1024 * 1024)
    origin.put("s.tar", data, content_md5=hashlib.md5(b"something else").digest())
    daemon = start_daemon({"web": origin.url})

    result = curl(f"{daemon.url}/web/s.tar")

    assert result.exit_code != 0 and len(result.body) < len(data)
    assert "md5 from Content-MD5 does not match" in daemon.log()
    assert curl(f"{daemon.url}/web/s.tar").headers["x-shardcache"] == "miss"


def test_etag_change_during_resume_fails_the_fill(origin: OriginServer, start_daemon) -> None:
    data = os.urandom(2 * 1024 * 1024)
    origin.put("s.tar", data, cut_after=500_000, cuts=1, delay_s=0)
    daemon = start_daemon({"web": origin.url})
    # The object is replaced while the first body is in flight: the resume must not splice.
    hold = threading.Event()
    origin.behaviour["s.tar"].hold = hold
    results = []
    worker = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s.tar")))
    worker.start()
    wait_for("the fill's GET", lambda: origin.gets["s.tar"])
    origin.etags["s.tar"] = '"' + base64.b16encode(os.urandom(16)).decode() + '"'
    origin.behaviour["s.tar"].hold = None
    hold.set()
    worker.join(60)

    assert results[0].exit_code != 0
    assert "changed" in daemon.log()
    # The client's connection is aborted first; the failed fill removes its file just after.
    wait_for("the partial file to go", lambda: not os.listdir(daemon.cache_dir / "v1" / "partial"))


def test_stalled_origin_times_out_instead_of_hanging(origin: OriginServer, start_daemon) -> None:
    data = os.urandom(1024 * 1024)
    origin.put("s.tar", data, stall_after=262_144)
    daemon = start_daemon(
        {"web": origin.url}, "--origin-read-timeout", "1", "--origin-retries", "1"
    )
    began = time.monotonic()
    result = curl(f"{daemon.url}/web/s.tar")
    assert result.exit_code != 0 and len(result.body) < len(data)
    assert time.monotonic() - began < 30
    assert daemon.metric("shardcache_origin_errors_total", origin="web", kind="timeout") >= 1


def test_crash_mid_fill_leaves_nothing_servable(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    data = os.urandom(3 * 1024 * 1024)
    hold = threading.Event()
    origin.put("s.tar", data, stall_after=1024 * 1024)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--origin-read-timeout", "60", cache_dir=cache_dir)
    worker = threading.Thread(target=lambda: curl(f"{daemon.url}/web/s.tar"))
    worker.start()
    partial = cache_dir / "v1" / "partial"
    wait_for("the fill's first bytes", lambda: any(p.stat().st_size for p in partial.iterdir()))
    daemon.stop(signal.SIGKILL)
    worker.join(30)
    hold.set()
    origin.behaviour["s.tar"].stall_after = None

    restarted = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    assert not list(partial.iterdir()), "start-up must sweep partial files"
    result = curl(f"{restarted.url}/web/s.tar")
    assert result.headers["x-shardcache"] == "miss" and result.sha256 == sha256(data)


def test_a_cache_file_truncated_under_the_daemon_aborts_the_hit(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    """Disk trouble on a hit (here: the entry's file cut short behind the daemon's back) must
    fail the transfer, not end it cleanly short."""
    data = os.urandom(3 * 1024 * 1024)
    origin.put("s.tar", data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    assert curl(f"{daemon.url}/web/s.tar").sha256 == sha256(data)
    index = cache_dir / "v1" / "index"
    wait_for("the fill's commit", lambda: list(index.rglob("*.val")))  # commit follows the body
    os.truncate(next(index.rglob("*.val")), 1024 * 1024)

    result = curl(f"{daemon.url}/web/s.tar")

    assert result.headers["x-shardcache"] == "hit"
    assert result.exit_code != 0 and len(result.body) == 1024 * 1024
    again = curl(f"{daemon.url}/web/s.tar")  # the broken entry was dropped and refetched
    assert again.headers["x-shardcache"] == "miss" and again.sha256 == sha256(data)


def test_a_failing_head_never_lets_a_corrupt_body_through(
    origin: OriginServer, start_daemon
) -> None:
    """Issue 9.1: Content-MD5 published, HEAD answers 500, body corrupt: never a success."""
    data = os.urandom(3 * 1024 * 1024)
    origin.put("s.tar", data, content_md5=hashlib.md5(b"the real bytes").digest(), head_status=500)
    daemon = start_daemon({"web": origin.url}, "--origin-retries", "1")

    for _ in range(2):
        result = curl(f"{daemon.url}/web/s.tar")
        assert result.exit_code != 0 and len(result.body) < len(data)
    assert origin.heads["s.tar"] == 4  # two fills, each a HEAD and one retry
    assert "checking the length only" not in daemon.log()
    assert "Traceback" not in daemon.log()


def test_a_206_for_another_range_is_refused(origin: OriginServer, start_daemon) -> None:
    """Issue 9.2: asked for bytes=2097152-, the origin sends bytes from 0 and says so."""
    data = os.urandom(5 * 1024 * 1024)
    origin.put("s.tar", data, wrong_range=True)
    daemon = start_daemon({"web": origin.url}, "--origin-retries", "1")

    result = curl(f"{daemon.url}/web/s.tar")

    assert result.exit_code != 0 and result.sha256 != sha256(data)
    assert "origin answered bytes 0-" in daemon.log()
    origin.behaviour["s.tar"].wrong_range = False
    again = curl(f"{daemon.url}/web/s.tar")
    assert again.exit_code == 0 and again.sha256 == sha256(data)
    assert again.headers["x-shardcache"] == "miss"  # the bad fill was never cached


def test_objects_streamed_through_uncached_are_verified(origin: OriginServer, start_daemon) -> None:
    """Issue 9.8: an 8 MiB object behind a 4 MiB cache, Content-MD5 published, body corrupt."""
    data = os.urandom(8 * 1024 * 1024)
    origin.put("big.tar", data, content_md5=hashlib.md5(b"the real bytes").digest())
    daemon = start_daemon({"web": origin.url}, cache_size="4MiB")

    for _ in range(2):
        result = curl(f"{daemon.url}/web/big.tar")
        assert result.exit_code != 0 and len(result.body) < len(data)
    assert "does not match" in daemon.log()
    origin.behaviour["big.tar"].content_md5 = None
    good = curl(f"{daemon.url}/web/big.tar")
    assert good.exit_code == 0 and good.sha256 == sha256(data)
    assert good.headers["x-shardcache"] == "miss"


def test_an_origin_without_head_is_checked_by_length(origin: OriginServer, start_daemon) -> None:
    """405 to HEAD is a definite answer (no checksums that way), not a failure to retry."""
    data = os.urandom(3 * 1024 * 1024)
    origin.put("s.tar", data, head_status=405)
    daemon = start_daemon({"web": origin.url})

    assert curl(f"{daemon.url}/web/s.tar").sha256 == sha256(data)
    hit = curl(f"{daemon.url}/web/s.tar")
    assert hit.headers["x-shardcache"] == "hit" and hit.headers["x-shardcache-verified"] == "length"
    assert origin.heads["s.tar"] == 1
