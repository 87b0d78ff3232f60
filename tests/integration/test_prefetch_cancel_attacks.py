"""Attacks on `shardcache prefetch --cancel` (issue 35): a cancel while the batch's fills run
(held at the origin), twice, then a new batch: fills that finish after the cancel pin nothing,
and the queue never waits on pins no reader will read."""

from __future__ import annotations

import os
import threading

from shardcache.loader import client
from tests.integration.helpers import curl, run_cli, wait_for
from tests.integration.test_data_parallel import SHARD_BYTES, _settle
from tests.origin_server import OriginServer


def _unread(daemon: object) -> int:
    return int(daemon.get_json("/_/prefetch")[1]["unread_bytes"])  # type: ignore[attr-defined]


def test_a_cancel_while_fills_run_leaves_nothing_pinned_and_the_next_batch_runs(
    origin: OriginServer, start_daemon
) -> None:
    release = threading.Event()
    for n in range(6):
        origin.put(f"h_{n:03d}.tar", os.urandom(SHARD_BYTES), hold=release)
    for n in range(2):
        origin.put(f"n_{n:03d}.tar", os.urandom(SHARD_BYTES))
    daemon = start_daemon(
        {"web": origin.url}, "--readahead", "0", "--prefetch-max-bytes", f"{2 * SHARD_BYTES}"
    )
    try:
        queued = run_cli("prefetch", "--lookahead", "/web/h_{000..005}.tar", "--daemon", daemon.url)
        assert queued.returncode == 0, queued.stderr
        held = [f"h_{n:03d}.tar" for n in range(6)]
        wait_for("two fills held at the origin", lambda: sum(origin.gets[k] for k in held) == 2)
        cancel = run_cli("prefetch", "--cancel", "1", "--daemon", daemon.url)
        assert cancel.returncode == 0, cancel.stderr
        assert "dropped 4 shards queued of batch 1; released 320 KiB" in cancel.stderr, (
            cancel.stderr
        )
        again = run_cli("prefetch", "--cancel", "1", "--daemon", daemon.url)
        assert again.returncode == 0 and "dropped 0 shards" in again.stderr, again.stderr
    finally:
        release.set()
    settled = _settle(daemon)
    assert settled["unread_bytes"] == 0 and settled["waiting_for"] is None, settled
    assert daemon.get_json("/_/status")[1]["prefetch"]["held_by"] == {}
    second = run_cli("prefetch", "--lookahead", "/web/n_{000..001}.tar", "--daemon", daemon.url)
    assert second.returncode == 0, second.stderr
    wait_for(
        "the next batch fetched",
        lambda: daemon.get_json("/_/prefetch?batch=2")[1]["batch"]["done"] == 2,
    )
    assert "Traceback" not in daemon.log()


def test_pins_of_a_plan_that_ends_before_any_sweep_do_not_hold_the_budget(
    origin: OriginServer, start_daemon
) -> None:
    """A job reads its first shard (read-ahead pins the next two, by its plan) and ends its plan
    at once, before the sweep ever saw who reads those pins: no plan reads them now, and none
    covers their origin. A look-ahead batch that needs their budget must not wait for them."""
    keys = [f"s_{n:03d}.tar" for n in range(6)]
    for key in keys:
        origin.put(key, os.urandom(SHARD_BYTES))
    origin.put("b_000.tar", os.urandom(SHARD_BYTES))
    daemon = start_daemon({"web": origin.url}, "--prefetch-max-bytes", f"{2 * SHARD_BYTES}")
    client.post_plan("job", 0, [f"/web/{key}" for key in keys], daemon.url)
    assert curl(f"{daemon.url}/web/s_000.tar").status == 200
    wait_for("read-ahead pinned two", lambda: _unread(daemon) == 2 * SHARD_BYTES)
    client.post_plan("job", 0, [], daemon.url)  # the job ended
    queued = run_cli("prefetch", "--lookahead", "/web/b_000.tar", "--daemon", daemon.url)
    assert queued.returncode == 0, queued.stderr
    wait_for(
        "the batch fetched, not waiting on pins nobody reads",
        lambda: daemon.get_json("/_/prefetch?batch=1")[1]["batch"]["done"] == 1,
        timeout_s=30,
    )
