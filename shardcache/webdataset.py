"""A WebDataset pipeline stage that tells the daemon which shards this worker reads next.

Place it after the shard list is shuffled and split by node and worker, so it sees the order
this worker will really read:

    wds.DataPipeline(
        wds.SimpleShardList("pipe:curl -s -f http://127.0.0.1:8470/lake/shards_{000..999}.tar"),
        wds.shuffle(1000), wds.split_by_node, wds.split_by_worker,
        prefetch_ahead(8),
        wds.tarfile_to_samples(), …)

Stdlib only; a daemon that cannot be reached is logged once and the pipeline goes on reading.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardcache import client

log = logging.getLogger("shardcache.webdataset")
Shard = dict[str, Any]


def prefetch_ahead(
    k: int = 8, daemon: str | None = None
) -> Callable[[Iterable[Shard]], Iterator[Shard]]:
    """Return a stage that, as each shard is handed on, asks the daemon for the next `k`."""
    if k < 1:
        raise ValueError("k must be at least 1")

    def stage(shards: Iterable[Shard]) -> Iterator[Shard]:
        window: collections.deque[Shard] = collections.deque()
        source = iter(shards)
        posted: set[str] = set()
        is_reachable = True
        for shard in source:
            window.append(shard)
            if len(window) <= k:
                continue
            is_reachable = _post(list(window)[1:], posted, daemon, is_reachable)
            yield window.popleft()
        while window:
            is_reachable = _post(list(window)[1:], posted, daemon, is_reachable)
            yield window.popleft()

    return stage


def _post(upcoming: list[Shard], posted: set[str], daemon: str | None, is_reachable: bool) -> bool:
    paths = []
    for shard in upcoming:
        try:
            path = client.local_path(str(shard["url"]), daemon)
        except client.ClientError:
            continue  # not a shard the daemon serves
        if path not in posted:
            paths.append(path)
    if not paths or not is_reachable:
        return is_reachable
    try:
        client.prefetch(paths, daemon)
    except client.ClientError as exc:
        log.warning("prefetch_ahead: %s; reading on without prefetch", exc)
        return False
    posted.update(paths)
    return True
