"""`shardcache prefetch --wait`: following a prefetch batch until it is done, as a bar on a
terminal (tqdm, when installed) or as a line per tenth or per minute for a log file, then one
line per shard that failed; exit 1 if any did.

Every figure shown is the daemon's answer (`GET /_/prefetch?batch=N`): a field missing or of
the wrong type is `client.not_understood`, and text from it is escaped (`printable`).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any

from shardcache.loader import client
from shardcache.printable import printable
from shardcache.units import format_size

PROGRESS_LINE_EVERY_S = 60.0  # without a terminal: a line a minute …
PROGRESS_LINE_STEP = 0.1  # … or per tenth of the batch, whichever comes first


def wait_for_batch(batch_id: int, daemon: str) -> int:
    """Follow batch `batch_id` of `daemon` until it is finished; 0 when every shard was
    cached, 1 when any failed or could not be cached. Raises ClientError."""
    with client.reading_answer(daemon):  # every field read below is the daemon's answer
        return _follow_batch(batch_id, daemon)


def _follow_batch(batch_id: int, daemon: str) -> int:
    batch = client.prefetch_status(batch_id, daemon)["batch"]
    if batch["total"] == 0:
        print("nothing to wait for: every shard was cached or in flight already", file=sys.stderr)
        return 0
    # No bar without tqdm (the loader-only install has none): the lines a log file gets.
    if sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None:
        batch = _follow_with_bar(batch_id, daemon, batch["total"])
    else:
        batch = _follow_with_lines(batch_id, daemon, batch["total"])
    for failure in batch["failures"]:
        print(
            printable(f"shardcache: prefetch of {failure['url']} failed: {failure['error']}"),
            file=sys.stderr,
        )
    if batch.get("not_cached"):
        print(
            printable(
                f"shardcache: {batch['not_cached']} of the shards could not be cached (larger "
                "than the cache, its room held by pinned look-ahead, or full of shards still in "
                "use: see docs/sizing.md); see the daemon's log"
            ),
            file=sys.stderr,
        )
    return 1 if batch["failed"] or batch.get("not_cached") else 0


def _follow_with_bar(batch_id: int, daemon: str, total: int) -> dict[str, Any]:
    from tqdm import tqdm

    with tqdm(total=total, unit="shard", dynamic_ncols=True) as bar:
        while True:
            batch: dict[str, Any] = client.prefetch_status(batch_id, daemon)["batch"]
            bar.n = batch["done"] + batch["failed"]
            waiting = f"; waiting for {batch['waiting_for']}" if batch.get("waiting_for") else ""
            bar.set_postfix_str(
                printable(f"{format_size(batch['bytes_done'])}, {batch['failed']} failed{waiting}")
            )
            bar.refresh()
            if batch["is_finished"]:
                return batch
            time.sleep(0.2)


def _follow_with_lines(batch_id: int, daemon: str, total: int) -> dict[str, Any]:
    """Progress for a log file or a pipe: a line per tenth of the batch or per minute, not a
    bar redrawn five times a second."""
    last_line_at, last_share = time.monotonic(), 0.0
    while True:
        batch: dict[str, Any] = client.prefetch_status(batch_id, daemon)["batch"]
        finished = batch["done"] + batch["failed"]
        share = finished / total
        now = time.monotonic()
        if (
            batch["is_finished"]
            or share - last_share >= PROGRESS_LINE_STEP
            or now - last_line_at >= PROGRESS_LINE_EVERY_S
        ):
            waiting = f"; waiting for {batch['waiting_for']}" if batch.get("waiting_for") else ""
            print(
                printable(
                    f"prefetch: {finished}/{total} shards ({share:.0%}), "
                    f"{format_size(batch['bytes_done'])}, {batch['failed']} failed{waiting}"
                ),
                file=sys.stderr,
                flush=True,
            )
            last_line_at, last_share = now, share
        if batch["is_finished"]:
            return batch
        time.sleep(0.2)
