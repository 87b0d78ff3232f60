"""Attacks on the fetch-bound fixes (a continuing request's `RequestContext`, the per-connection
'reader left' watch): requests of a client whose answer has not started must stay sheddable,
and must stop when that client leaves."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import CurlResult, curl, wait_for
from tests.origin_server import OriginServer

MiB = 1 << 20


def _passthrough_daemon(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> Daemon:
    """A 1 MiB cache in front of an origin capped at 0.5 requests a second, read timeout 4 s
    (the caps' wait bound), one connection a fill: a 3 MiB object is streamed through
    (PASSTHROUGH), and every reader that joined its fill while it started gets its own GET
    (`Fill.join_passthrough`)."""
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "{origin.url}"\nmax_requests_per_second = 0.5\n')
    return start_daemon(
        {},
        "--config",
        str(config),
        "--origin-read-timeout",
        "4",
        "--origin-connections",
        "1",
        "--readahead",
        "0",
        "--shutdown-grace",
        "1",
        cache_size="1MiB",
    )


def _readers(url: str, count: int, *args: str) -> list[tuple[CurlResult, float]]:
    """`count` curl readers of `url` started 0.05 s apart; each result with its seconds."""
    results: list[tuple[CurlResult, float] | None] = [None] * count

    def read(n: int) -> None:
        began = time.monotonic()
        answer = curl(url, *args)
        results[n] = (answer, time.monotonic() - began)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(60)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def test_joiners_of_a_streamed_through_object_are_shed_like_any_new_request(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Seven readers ask for one uncacheable 3 MiB object at once (the origin answers each
    GET after 1 s). The first streams the fill's answer through; the six that joined the fill
    each need their own whole-object GET, and nothing of their answers has started: like any
    new request under `max_requests_per_second = 0.5`, one whose turn is more than the read
    timeout (4 s) off must be shed at once with 503 and Retry-After (`fetch.capped`), not
    queued. `OriginRequests._asking` marked them continuing (never shed; first at the limiter)
    because the fill "started", whoever's answer that was."""
    data = os.urandom(3 * MiB)
    origin.put("big.tar", data, delay_s=1.0)
    daemon = _passthrough_daemon(origin, start_daemon, tmp_path)
    results = _readers(f"{daemon.url}/a/big.tar", 7, "--max-time", "40")
    seen = [
        (n, r.status, r.headers.get("retry-after"), len(r.body), round(s, 1))
        for n, (r, s) in enumerate(results)
    ]
    for answer, _ in results:
        assert answer.status in (200, 503), seen
        if answer.status == 200:
            assert answer.body == data, seen
        else:
            assert answer.headers.get("retry-after"), seen
    slowest = max(seconds for _, seconds in results)
    assert slowest < 4 + 2.5, (
        f"a reader waited {slowest:.1f} s for its answer under a 4 s wait bound "
        f"(reader, status, Retry-After, bytes, seconds): {seen}"
    )


def test_joiners_of_a_streamed_through_object_that_left_send_nothing(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """The same uncacheable object, one reader that stays and six that join its fill and give
    up after 1.5 s, while their own GETs wait for turns at 2, 4 … 12 s. A reader that left
    must hold no turn and have nothing sent for it (`ShardCache.open`'s `reader_left`, the
    cap's `give_back`): the watch covers only `fill.wait_started()`, not the joiner's
    `join_passthrough()` GET that follows it."""
    data = os.urandom(3 * MiB)
    origin.put("big.tar", data, delay_s=1.0)
    daemon = _passthrough_daemon(origin, start_daemon, tmp_path)
    stayer = threading.Thread(target=curl, args=(f"{daemon.url}/a/big.tar", "--max-time", "30"))
    stayer.start()
    # Its fill is registered before it asks the origin anything: the six join it.
    wait_for("the stayer's fill", lambda: origin.heads["big.tar"] + origin.gets["big.tar"])
    _readers(f"{daemon.url}/a/big.tar", 6, "--max-time", "1.5")
    stayer.join(30)
    time.sleep(12)  # every turn booked for a leaver has come by now
    assert origin.gets["big.tar"] == 1, (
        f"the origin was sent {origin.gets['big.tar']} GETs for one reader that stayed "
        "and six that had left before their turns"
    )
