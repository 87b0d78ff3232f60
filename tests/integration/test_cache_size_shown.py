"""What people are told a cache holds counts its entries' bytes, with the index apart: an empty
cache said "572 KiB of 20 GiB used, 0 entries" (the index database and its allowances)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli, wait_for


def test_an_empty_cache_shows_0_bytes_and_its_index_apart(
    tmp_path: Path, start_daemon: Callable[..., Daemon]
) -> None:
    root = tmp_path / "shards"
    root.mkdir()
    (root / "a.tar").write_bytes(b"a" * 300_000)
    daemon = start_daemon({"files": f"file://{root}"}, "--cache-size", "20GiB")

    started = daemon.wait_for_log("serving on")
    line = re.search(r"cache \S+: (.*?) --eviction", started)
    assert line, started
    assert re.fullmatch(r"0 B in 0 entries of 20 GiB \(index \d+(\.\d+)? KiB\),", line[1]), line[1]
    cache = daemon.get_json("/_/status")[1]["cache"]
    assert cache["entry_bytes"] == 0 and cache["entries"] == 0
    assert cache["size_bytes"] > 0  # the index, which counts against --cache-size
    stats = run_cli("stats", "--daemon", daemon.url)
    assert stats.returncode == 0, stats.stderr
    assert re.search(r"^cache +0 B in 0 entries of 20 GiB \(\+", stats.stdout, re.M), stats.stdout

    assert curl(f"{daemon.url}/files/a.tar").exit_code == 0
    wait_for("the entry", lambda: daemon.get_json("/_/status")[1]["cache"]["entries"] == 1)
    assert daemon.get_json("/_/status")[1]["cache"]["entry_bytes"] == 300_000
