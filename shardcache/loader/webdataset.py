"""A WebDataset pipeline stage that tells the daemon which shards this worker reads next.

Place it after the shard list is shuffled and split by node and worker, so it sees the order
this worker will really read:

    wds.DataPipeline(
        wds.SimpleShardList("pipe:curl -s -f http://127.0.0.1:8470/lake/shards_{000..999}.tar"),
        wds.detshuffle(1000, seed=0), wds.split_by_node, wds.split_by_worker,
        prefetch_ahead(8),
        wds.tarfile_to_samples(), …)

The daemon is the one the shard URLs name. Each time the stage starts (each epoch) it also
posts the worker's whole order as a plan (`POST /_/plan`, job = host, process and stage), so
that the daemon's eviction keeps what this worker and the others read soonest. Stdlib only; a
daemon that cannot be reached is logged once and the pipeline goes on reading.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardcache.loader import client

log = logging.getLogger("shardcache.webdataset")
Shard = dict[str, Any]


_stage_numbers = itertools.count()


PLAN_WINDOW = 2048  # shards a plan names at once: an endless source (ResampledShards) flows


def prefetch_ahead(
    k: int = 8, daemon: str | None = None, plan: bool = True
) -> Callable[[Iterable[Shard]], Iterator[Shard]]:
    """Return a stage that, as each shard is handed on, asks the daemon for the next `k`.

    The daemon is the one each shard URL names (`http://127.0.0.1:8470/NAME/KEY`, also inside
    `pipe:curl …`), unless `daemon` is given. With `plan` (the default), the stage also posts
    this worker's order as a plan: it reads the (already shuffled and split) shard list up to
    PLAN_WINDOW names ahead, and posts the window again each time half of it was handed on, so
    an endless or very long source still flows at once. A daemon that cannot be reached, or
    shards that name none, are reported once each as a warning; the pipeline reads on either
    way.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    stage_number = next(_stage_numbers)
    epochs = itertools.count()
    reach = max(PLAN_WINDOW, k + 1) if plan else k + 1

    def stage(shards: Iterable[Shard]) -> Iterator[Shard]:
        poster = _Poster(daemon)
        source = iter(shards)
        job = f"{socket.gethostname()}:{os.getpid()}:{stage_number}"
        epoch = next(epochs)
        ahead: collections.deque[Shard] = collections.deque(itertools.islice(source, reach))
        handed_since_plan = 0
        if plan:
            poster.post_plan(job, epoch, list(ahead))
        while ahead:
            shard = ahead.popleft()
            ahead.extend(itertools.islice(source, reach - len(ahead)))
            handed_since_plan += 1
            if plan and handed_since_plan >= PLAN_WINDOW // 2 and ahead:
                poster.post_plan(job, epoch, list(ahead))  # the rest, from here
                handed_since_plan = 0
            poster.post(list(itertools.islice(ahead, k)))
            yield shard

    return stage


class _Poster:
    """Posts each upcoming shard once, to the daemon its URL names."""

    def __init__(self, daemon: str | None) -> None:
        self._daemon = client.daemon_url(daemon) if daemon else None
        self._posted: set[tuple[str, str]] = set()
        self._unreachable: set[str] = set()
        self._planless: set[str] = set()  # daemons that refused a plan
        self._warned_unserved = False

    def _by_daemon(self, shards: list[Shard]) -> dict[str, list[str]]:
        """The shards' local paths, grouped by the daemon that serves them, in order."""
        by_daemon: dict[str, list[str]] = {}
        for shard in shards:
            url = str(shard["url"])
            base = self._daemon or client.daemon_of(url)
            try:
                if base is None:
                    raise client.ClientError(f"{url} names no shardcache daemon")
                path = client.local_path(url, base)
            except client.ClientError as exc:
                if not self._warned_unserved:
                    self._warned_unserved = True
                    log.warning("prefetch_ahead: %s; not prefetching such shards", exc)
                continue
            if base not in self._unreachable:
                by_daemon.setdefault(base, []).append(path)
        return by_daemon

    def post_plan(self, job: str, epoch: int, shards: list[Shard]) -> None:
        for base, paths in self._by_daemon(shards).items():
            if base in self._planless:
                continue
            try:
                client.post_plan(job, epoch, paths, base)
            except client.ClientError as exc:
                if exc.status == 409:  # --eviction lru: plans are off by the operator's choice
                    self._planless.add(base)
                    log.debug("prefetch_ahead: %s; reading on without a plan", exc)
                elif exc.status in (400, 404, 405, 413, 429):  # older daemon, too big, full
                    self._planless.add(base)
                    log.warning("prefetch_ahead: %s; reading on without a plan", exc)
                else:  # down, or the token is wrong: prefetching would fail the same way
                    self._unreachable.add(base)
                    log.warning("prefetch_ahead: %s; reading on without prefetch", exc)

    def post(self, upcoming: list[Shard]) -> None:
        by_daemon = {
            base: [path for path in paths if (base, path) not in self._posted]
            for base, paths in self._by_daemon(upcoming).items()
        }
        for base, paths in by_daemon.items():
            if not paths:
                continue
            try:
                client.prefetch(paths, base)
            except client.ClientError as exc:
                self._unreachable.add(base)
                log.warning("prefetch_ahead: %s; reading on without prefetch", exc)
                continue
            self._posted.update((base, path) for path in paths)
