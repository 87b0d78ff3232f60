"""What the store does at its limits (issue 23, item 8 and two of item 11): an object larger
than the filesystem evicts nothing, a restart of a nearly full cache raises no false alarm, and
a purge the disk refuses is not answered "deleted". Each failed on 0be7475."""

from __future__ import annotations

import functools
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.disk_helpers import MiB, assert_no_crash, entry_files, read_only, tmpfs
from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer


def _is_hit(daemon: Daemon, key: str) -> bool:
    return curl(f"{daemon.url}/web/{key}", "-I").headers.get("x-shardcache") == "hit"


def _delete(daemon: Daemon, path: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(daemon.url + path, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_object_larger_than_the_filesystem_evicts_nothing(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """0be7475: one read of a 24 MiB object on a 16 MiB filesystem (under --cache-size)
    evicted all 8 entries, then streamed it through anyway."""
    small = {f"s_{i}.tar": os.urandom(MiB) for i in range(8)}
    for key, data in small.items():
        origin.put(key, data)
    huge = os.urandom(24 * MiB)
    origin.put("huge.tar", huge)
    with tmpfs(tmp_path / "cache", 16 * MiB) as cache_dir:
        daemon = start_daemon(
            {"web": origin.url}, "--readahead", "0", cache_size="1GiB", cache_dir=cache_dir
        )
        for key in small:
            assert curl(f"{daemon.url}/web/{key}").status == 200
            wait_for(f"{key}'s commit", functools.partial(_is_hit, daemon, key))
        assert len(entry_files(cache_dir)) == 8

        result = curl(f"{daemon.url}/web/huge.tar")
        assert (result.exit_code, result.status) == (0, 200), result
        assert result.sha256 == sha256(huge)
        assert result.headers["x-shardcache"] == "miss"

        kept = len(entry_files(cache_dir))
        assert kept == 8, f"{8 - kept} entries evicted for an object that cannot fit"
        assert daemon.metric("shardcache_cache_evictions_total") == 0
        assert all(_is_hit(daemon, key) for key in small)
        assert daemon.stop() == 0
        assert_no_crash(daemon.log(), [result])


def test_a_restart_of_a_nearly_full_cache_says_nothing_is_wrong(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """0be7475 counted the cached entries as the index's own size at start-up: every restart
    of a nearly full cache warned "nothing can be cached"."""
    for i in range(10):
        origin.put(f"s_{i}.tar", os.urandom(MiB))
    cache_dir = tmp_path / "cache"
    lru = ("--readahead", "0", "--eviction", "lru")  # every read cached, the oldest evicted
    first = start_daemon({"web": origin.url}, *lru, cache_size="8MiB")
    for i in range(10):
        assert curl(f"{first.url}/web/s_{i}.tar").status == 200
        wait_for(f"s_{i}.tar's commit", functools.partial(_is_hit, first, f"s_{i}.tar"))
    assert first.stop() == 0
    assert len(entry_files(cache_dir)) >= 6  # nearly full: 8 MiB with the index's share

    again = start_daemon({"web": origin.url}, *lru, cache_size="8MiB")
    assert _is_hit(again, "s_9.tar")
    assert "nothing can be cached" not in again.log(), again.log()[-3000:]
    # A bound the index alone fills is still told.
    assert again.stop() == 0
    tiny = start_daemon({"web": origin.url}, "--readahead", "0", cache_size="1MiB")
    assert "nothing can be cached" in tiny.log()


def test_a_purge_on_a_read_only_cache_dir_is_not_answered_deleted(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """0be7475 dropped the index row (its database was open before the remount), left the
    file, and answered 200 {"deleted": ...}."""
    data = os.urandom(MiB)
    origin.put("s_0.tar", data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
    assert curl(f"{daemon.url}/web/s_0.tar").status == 200
    wait_for("the commit", functools.partial(_is_hit, daemon, "s_0.tar"))

    with read_only(cache_dir):
        status, answer = _delete(daemon, "/_/cache/web/s_0.tar")
        assert status == 503, (status, answer)
        assert "deleted" not in answer and "not writable" in str(answer["error"]), answer
        assert len(entry_files(cache_dir)) == 1

    assert _is_hit(daemon, "s_0.tar")  # nothing was half done: the entry is whole
    assert _delete(daemon, "/_/cache/web/s_0.tar") == (
        200,
        {"deleted": "web/s_0.tar", "entry_deleted": True, "fill_not_kept": False},
    )
    assert entry_files(cache_dir) == []
    assert daemon.stop() == 0
    assert_no_crash(daemon.log())
