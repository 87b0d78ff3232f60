"""The online scrub (issue 24, item 3): a byte flipped in a cached file is found by the running
daemon, dropped and refetched, instead of being served as a verified hit; `shardcache verify`
checks a live cache through the daemon."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.disk_helpers import MiB, entry_files, flip_byte
from tests.integration.helpers import curl, run_cli, sha256, wait_for
from tests.origin_server import OriginServer


def _cached(daemon: Daemon, origin: OriginServer, key: str, size: int) -> tuple[bytes, Path]:
    """Put `key` on the origin, read it through the daemon (a miss, then a hit); return its
    bytes and its file in the cache."""
    data = os.urandom(size)
    origin.put(key, data)
    before = set(entry_files(daemon.cache_dir))
    assert curl(f"{daemon.url}/o/{key}").headers["x-shardcache"] == "miss"
    wait_for("the fill's commit", lambda: set(entry_files(daemon.cache_dir)) - before)
    hit = curl(f"{daemon.url}/o/{key}")
    assert hit.headers["x-shardcache"] == "hit" and hit.sha256 == sha256(data)
    (path,) = set(entry_files(daemon.cache_dir)) - before
    return data, path


def _post(daemon: Daemon, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(daemon.url + path, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_scrub_drops_a_flipped_byte_and_the_next_read_refetches(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "1GiB")
    data, path = _cached(daemon, origin, "shards/rot-000.tar", 3 * MiB + 7)
    flip_byte(path, 2 * MiB + 3)

    wait_for("the scrub's find", lambda: daemon.metric("shardcache_scrub_corrupt_total") >= 1)
    again = curl(f"{daemon.url}/o/shards/rot-000.tar")
    assert again.headers["x-shardcache"] == "miss" and again.sha256 == sha256(data)
    warnings = [line for line in daemon.log().splitlines() if " WARNING " in line]
    assert any("scrub" in line and "shards/rot-000.tar" in line for line in warnings), warnings
    assert daemon.metric("shardcache_scrub_bytes_total") >= 3 * MiB
    _, status = daemon.get_json("/_/status")
    scrub = status["scrub"]
    assert isinstance(scrub, dict)
    assert scrub["rate_bytes_per_s"] == 1 << 30 and scrub["corrupt"] == 1
    assert scrub["checked_bytes"] >= 3 * MiB
    wait_for("a whole pass", lambda: daemon.get_json("/_/status")[1]["scrub"]["passes"] >= 1)  # type: ignore[index]


def test_with_the_scrub_off_verify_checks_the_live_cache_through_the_daemon(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    # Hits unchecked too (--verify-hits off): only `verify` is left to find the rot.
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0", "--verify-hits", "off")
    data, path = _cached(daemon, origin, "rot-001.tar", 2 * MiB)
    flip_byte(path, 12345)

    # The control: with the scrub off, nothing looks at the bytes; the hit serves the rot.
    time.sleep(2)  # two of the scrub's pass pauses, had it been on
    assert daemon.metric("shardcache_scrub_bytes_total") == 0
    rotten = curl(f"{daemon.url}/o/rot-001.tar")
    assert rotten.headers["x-shardcache"] == "hit" and rotten.sha256 != sha256(data)

    found = run_cli(
        "verify", "--cache-dir", str(daemon.cache_dir), "--daemon", daemon.url, "--json"
    )
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    assert report["clean"] is False and report["entries"] == 1
    assert [p["key"] for p in report["problems"]] == [f"{origin.url}/rot-001.tar"]
    assert report["problems"][0]["kind"] == "corrupt" and report["problems"][0]["dropped"]
    again = curl(f"{daemon.url}/o/rot-001.tar")
    assert again.headers["x-shardcache"] == "miss" and again.sha256 == sha256(data)
    wait_for("the refill's commit", lambda: len(entry_files(daemon.cache_dir)) == 1)
    clean = run_cli("verify", "--cache-dir", str(daemon.cache_dir), "--daemon", daemon.url)
    assert clean.returncode == 0, clean.stderr
    assert "1 entries" in clean.stdout and "no damage found" in clean.stdout
    assert daemon.metric("shardcache_scrub_corrupt_total") == 1


def test_verify_of_a_live_cache_whose_daemon_cannot_be_asked_is_one_line(
    start_daemon: Callable[..., Daemon], origin: OriginServer, tmp_path: Path
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0")
    elsewhere = run_cli("verify", "--cache-dir", str(tmp_path / "other"), "--daemon", daemon.url)
    assert elsewhere.returncode == 2  # no cache there: the offline check says so
    wrong = run_cli(
        "verify", "--cache-dir", str(daemon.cache_dir), "--daemon", "http://127.0.0.1:9"
    )
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
    assert "in use by another shardcache daemon" in wrong.stderr and "Traceback" not in wrong.stderr


def test_the_verify_endpoint_refuses_bad_input_with_json(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    assert daemon.get_json("/_/verify") == (200, {"verify": None})
    for body in (b"not json", b"[]", b'{"repair": true}', b'"x"'):
        status, answer = _post(daemon, "/_/verify", body)
        assert status == 400 and isinstance(answer.get("error"), str), (body, answer)
    status, answer = _post(daemon, "/_/verify", b"")
    assert status == 202 and isinstance(answer["verify"], dict)
    wait_for(
        "the pass's end",
        lambda: daemon.get_json("/_/verify")[1]["verify"]["is_finished"],  # type: ignore[index]
    )
    _, status_document = daemon.get_json("/_/status")
    scrub = status_document["scrub"]
    assert isinstance(scrub, dict) and scrub["rate_bytes_per_s"] == 32 << 20  # the default


def test_sigterm_does_not_wait_for_a_scrub_pass(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    # 4 MiB at 64 KiB/s is a 64-second pass: longer than `stop` waits before killing.
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "64KiB")
    _cached(daemon, origin, "slow.tar", 4 * MiB)
    wait_for("the scrub's read", lambda: daemon.metric("shardcache_scrub_bytes_total") > 0)
    assert daemon.stop() == 0


def test_a_fifo_in_place_of_an_entry_file_neither_hangs_verify_nor_the_exit(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """Attack: a FIFO where an entry's file was hung the scrub thread in `open`; verify never
    finished, and after SIGTERM the daemon logged "stopped" and stayed until kill -9."""
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0")
    data, path = _cached(daemon, origin, "fifo.tar", MiB)
    os.unlink(path)
    os.mkfifo(path)
    try:
        status, _ = _post(daemon, "/_/verify", b"")
        assert status == 202
        wait_for(
            "the pass's end",
            lambda: daemon.get_json("/_/verify")[1]["verify"]["is_finished"],  # type: ignore[index]
        )
    finally:
        with contextlib.suppress(OSError):  # (before the fix) a writer frees the stuck open
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    report = daemon.get_json("/_/verify")[1]["verify"]
    assert isinstance(report, dict) and report["damaged"] == 1, report
    assert report["problems"][0]["dropped"] and not os.path.lexists(path)
    again = curl(f"{daemon.url}/o/fifo.tar")
    assert again.headers["x-shardcache"] == "miss" and again.sha256 == sha256(data)
    started = time.monotonic()
    assert daemon.stop() == 0 and time.monotonic() - started < 10


def test_a_fifo_where_an_entry_was_is_a_miss_not_a_hang(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """Review attack: a hit on an entry whose file was replaced by a FIFO blocked in `open`
    for ever (curl timed out), and the daemon then could not exit. It is a miss now, refetched,
    and the daemon stops."""
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0")
    data, path = _cached(daemon, origin, "shards/fifo-000.tar", MiB + 3)
    path.unlink()
    os.mkfifo(path)
    again = curl(f"{daemon.url}/o/shards/fifo-000.tar", "--max-time", "10")
    assert again.exit_code == 0 and again.sha256 == sha256(data)
    assert again.headers["x-shardcache"] == "miss"
    assert daemon.stop() == 0
