"""A WebDataset pipeline stage, `prefetch_ahead(n)`, that tells the daemon which shards this worker
reads next; place it after the shard list is shuffled and split by node and worker.

Each epoch it also posts the worker's order as a plan (`POST /_/plan`). Stdlib only; a daemon
that cannot be reached is logged once and the pipeline goes on. Example: docs/prefetch.md."""

from __future__ import annotations

import collections
import itertools
import logging
import os
import socket
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator
from types import FrameType
from typing import Any

from shardcache.loader import client, pipeline_order

log = logging.getLogger("shardcache.webdataset")
Shard = dict[str, Any]


_stage_numbers = itertools.count()


PLAN_WINDOW = 2048  # shards a plan names at once: an endless source (ResampledShards) flows
# Where the pipeline's order is computable, a plan names the later epochs too: with four, one
# node of four keeps at least 98% of the offline optimum's hits at 10-50% cache (10 epochs, six
# seeds; with three, 93% at 50%; `benchmarks/trace_sim.py`), up to FORECAST_WINDOW names a post.
PLAN_EPOCHS_AHEAD = 4
FORECAST_WINDOW = 8192  # 64 workers on one daemon (8 ranks x 8): half the daemon's key bound

_said: set[str] = set()  # advice given once per process
_CANNOT_REPLAY = "the next epochs' order could not be computed; plans name this epoch only"


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("prefetch_ahead: %s", message)


def prefetch_ahead(
    k: int = 8, daemon: str | None = None, plan: bool = True
) -> Callable[[Iterable[Shard]], Iterator[Shard]]:
    """Return a stage that, as each shard is handed on, asks the daemon for the next `k`.

    The daemon is the one each shard URL names (`http://127.0.0.1:8470/NAME/KEY`, also inside
    `pipe:curl …`), unless `daemon` is given. With `plan` (the default), the stage also posts
    this worker's order as a plan: it reads the (already shuffled and split) shard list up to
    PLAN_WINDOW names ahead, and posts the window again each time half of it was handed on, so
    an endless or very long source still flows at once. Where the pipeline's order is
    computable (`wds.detshuffle` before `split_by_node`/`split_by_worker`, see
    `pipeline_order`), the plan goes on with the next PLAN_EPOCHS_AHEAD epochs' orders, and
    the last `k` shards of an epoch prefetch the first of the next. A daemon that cannot be
    reached, shards that name none, and a pipeline whose later order cannot be computed or
    whose nodes would read overlapping shares are each reported once as a warning; the
    pipeline reads on either way.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    return _PrefetchStage(k, daemon, plan)


class _PrefetchStage:
    """The stage `prefetch_ahead` returns: called by WebDataset once per epoch."""

    def __init__(self, k: int, daemon: str | None, plan: bool) -> None:
        self.k = k
        self.daemon = daemon
        self.plan = plan
        self.number = next(_stage_numbers)
        self.epochs_seen = 0  # by this process: a DataLoader worker's copy starts again
        self.process = os.getpid()
        self.known_orders: dict[Hashable, list[Shard]] = {}  # later epochs', computed before
        self.reach = max(PLAN_WINDOW, k + 1) if plan else k + 1

    def __getstate__(self) -> dict[str, object]:
        """A copy for another process (a DataLoader worker started by spawn) starts afresh
        there: the later epochs' orders known here (up to FORECAST_WINDOW shards) stay."""
        return {**self.__dict__, "known_orders": {}}

    def __call__(self, shards: Iterable[Shard]) -> Iterator[Shard]:
        if self.process != os.getpid():  # a copy in a worker (fork or spawn): a fresh start
            self.process, self.epochs_seen = os.getpid(), 0
            self.known_orders = {}
        # Asked now, not when the generator starts: the caller's frame is the pipeline's.
        later = self._later_epochs(sys._getframe(1)) if self.plan else None
        epoch = self.epochs_seen
        self.epochs_seen += 1
        return self._hand_on(iter(shards), epoch, later)

    def _later_epochs(self, caller: FrameType | None) -> Iterator[Shard] | None:
        """The next epochs' shards for this worker (computed when first needed), or None when
        the calling pipeline's order cannot be computed (said once in the log). A stage that
        fails to be looked at or replayed costs the forecast, never the epoch."""
        try:
            return self._forecast(caller)
        except Exception as exc:
            _say_once(f"{_CANNOT_REPLAY} ({type(exc).__name__}: {exc})")
            return None

    def _forecast(self, caller: FrameType | None) -> Iterator[Shard] | None:
        found = pipeline_order.calling_pipeline(caller, self)
        if found is None:
            return None
        pipeline, index = found
        every_step = list(getattr(pipeline, "pipeline", []))
        steps = every_step[:index]
        after = every_step[index + 1 :]
        for risk in (
            pipeline_order.nodes_risk(steps, after),
            pipeline_order.workers_risk(steps, after),
        ):
            if risk is not None:
                _say_once(risk)
        try:
            forecast = pipeline_order.forecast(steps)
        except pipeline_order.Unpredictable as exc:
            _say_once(f"{exc}: plans name this epoch only (wds.detshuffle(seed=...) lets "
                      "the daemon's eviction keep what the next epochs read)")  # fmt: skip
            return None
        if pipeline_order.in_fresh_dataloader_worker(self.epochs_seen):
            return None  # the next epoch may start from the first order again
        return pipeline_order.chained(forecast, PLAN_EPOCHS_AHEAD, self.known_orders)

    def _hand_on(
        self, source: Iterator[Shard], epoch: int, later: Iterator[Shard] | None
    ) -> Iterator[Shard]:
        poster = _Poster(self.daemon)
        job = f"{socket.gethostname()}:{os.getpid()}:{self.number}"
        ahead: collections.deque[Shard] = collections.deque(itertools.islice(source, self.reach))
        following: list[Shard] = []  # the next epochs', once this one's end is in sight

        def upcoming(count: int) -> list[Shard]:
            """The next `count` shards: this epoch's, then (once this epoch's source is
            exhausted, at most FORECAST_WINDOW in all) the next epochs'."""
            nonlocal later
            exhausted = len(ahead) < self.reach
            short = min(count, FORECAST_WINDOW) - len(ahead) - len(following)
            if later is not None and exhausted and short > 0:
                try:
                    following.extend(itertools.islice(later, short))
                except Exception as exc:  # a replayed stage failed: this epoch reads on
                    _say_once(f"{_CANNOT_REPLAY} ({type(exc).__name__}: {exc})")
                    later = None
            return list(itertools.islice(itertools.chain(ahead, following), count))

        plan_size = PLAN_WINDOW if later is None else FORECAST_WINDOW
        handed_since_plan = 0
        if self.plan:
            poster.post_plan(job, epoch, upcoming(plan_size))
        while ahead:
            shard = ahead.popleft()
            ahead.extend(itertools.islice(source, self.reach - len(ahead)))
            handed_since_plan += 1
            if self.plan and handed_since_plan >= PLAN_WINDOW // 2 and ahead:
                poster.post_plan(job, epoch, upcoming(plan_size))  # the rest, from here
                handed_since_plan = 0
            poster.post(upcoming(self.k))
            yield shard


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
            if not isinstance(shard, dict) or "url" not in shard:
                raise TypeError(
                    "prefetch_ahead takes shards ({'url': ...}) and got "
                    f"{type(shard).__name__} without a 'url': place it before "
                    "tarfile_to_samples, after the shard list is shuffled and split"
                )
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
                try:
                    client.post_plan(job, epoch, paths, base)
                except client.ClientError as exc:
                    # Too large, or the daemon's plans are at their bound: the next epochs are
                    # the part to give up first, the window of this epoch is still worth it.
                    if exc.status not in (413, 429) or len(paths) <= PLAN_WINDOW:
                        raise
                    log.debug("prefetch_ahead: %s; posting %d names only", exc, PLAN_WINDOW)
                    client.post_plan(job, epoch, paths[:PLAN_WINDOW], base)
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
