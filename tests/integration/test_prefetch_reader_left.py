"""An attack on the 'reader left' watch (`ShardCache.open`'s `reader_left`) with the prefetch
queue: a prefetch must still bring its object in when a reader of it came and left."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer


def test_a_prefetch_completes_when_a_reader_of_its_object_came_and_left(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    """`POST /_/prefetch` of one shard from an origin that answers every request after 1 s;
    0.2 s later a reader asks for the same shard and gives up after 0.3 s (a loader's short
    timeout, a killed worker). The prefetch is still wanted: 4 s later the shard must be a
    hit. Found: a miss, the origin sent a further GET. The reader's own fill is now let go
    of at once and stopped ("every reader left") while the prefetch's HEAD is still out;
    when the HEAD returns, `ShardCache.start_prefetch` sees a fill for the key that finished
    meanwhile (`Flights.ended` counts the abandoned one too) and takes the object as CACHED, so
    nothing is fetched. Before the watch the fill lived until the origin answered, and the
    prefetch joined it."""
    data = os.urandom(1 << 20)
    origin.put("p.tar", data, delay_s=1.0)
    daemon = start_daemon({"o": origin.url}, "--readahead", "0")
    request = urllib.request.Request(
        daemon.url + "/_/prefetch",
        data=json.dumps({"origin": "o", "keys": ["p.tar"]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202
    wait_for("the prefetch's HEAD", lambda: origin.heads["p.tar"])  # out for 1 s
    left = curl(f"{daemon.url}/o/p.tar", "--max-time", "0.3")
    assert left.exit_code == 28  # the reader gave up before the origin answered

    def prefetch_ended() -> bool:
        status = daemon.get_json("/_/prefetch")[1]
        return status["done"] + status["failed"] >= 1  # type: ignore[operator]

    wait_for("the prefetch to end", prefetch_ended)
    gets_before = origin.gets["p.tar"]
    answer = curl(f"{daemon.url}/o/p.tar")
    assert answer.body == data
    assert answer.headers.get("x-shardcache") == "hit", (
        f"after the prefetch: {answer.headers.get('x-shardcache')}, the origin sent "
        f"{origin.gets['p.tar'] - gets_before} more GET(s)\n"
        + "\n".join(line for line in daemon.log().splitlines() if "p.tar" in line)
    )


def _read_and_leave(url: str, count: int) -> None:
    """Read the first `count` body bytes of `url`, then close the connection."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("GET", parts.path)
        response = connection.getresponse()
        assert response.status == 200
        got = 0
        while got < count:
            got += len(response.read1(count - got))
    finally:
        connection.close()


def test_a_reader_that_leaves_near_the_end_lets_the_fill_finish(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    """CI, under load: a WebDataset loader stops reading at the tar's end-of-archive blocks,
    before the record padding after them; its curl, writing the padding into the closed pipe,
    exits, and the fill, a few KiB from its end, was stopped with it: the shard stayed a miss
    the next epoch. A fill whose last reader leaves within FINISH_LEFT_BYTES of its end now
    finishes and is cached; one left far from its end still stops (the control)."""
    size = 2 << 20
    for key in ("near.tar", "far.tar"):
        origin.put(key, os.urandom(size), chunk_bytes=64 * 1024, chunk_delay_s=0.03)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")

    _read_and_leave(f"{daemon.url}/web/near.tar", size - 200 * 1024)
    _read_and_leave(f"{daemon.url}/web/far.tar", 256 * 1024)

    def answers_ended() -> bool:  # both origins' answers end (or stop), one entry cached
        entries = daemon.metric("shardcache_cache_entries")
        return entries >= 1 and daemon.metric("shardcache_receiver_requests_in_flight") == 0

    wait_for("the near fill's commit and the far one's stop", answers_ended)

    assert curl(f"{daemon.url}/web/near.tar").headers["x-shardcache"] == "hit"
    assert origin.gets["near.tar"] == 1
    assert curl(f"{daemon.url}/web/far.tar").headers["x-shardcache"] == "miss"
    assert origin.gets["far.tar"] == 2
