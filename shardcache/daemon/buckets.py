"""`BucketsOnDemand`: S3 buckets an S3 client names with no origin configured, each made an origin
`s3://BUCKET` on first use with the daemon's credentials (`--s3-buckets-on-demand N`, at most N).

A bucket becomes an origin only once a one-key listing of it succeeded; a refused name is not
asked again for REFUSED_FOR_S, and at most TRIES_PER_MINUTE new names are tried a minute.
Here because only the composition root builds origins."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from collections.abc import Callable

from shardcache.cluster.tier import redact_url
from shardcache.config import OriginSpec
from shardcache.daemon.origin_factory import make_origin
from shardcache.errors import InvalidKey, OriginError, QueueFull, UnknownOrigin
from shardcache.fetch.origin_table import ConfiguredOrigin, OriginTable
from shardcache.keys import validate_origin_name
from shardcache.observability.metrics import Metrics
from shardcache.origins.base import Origin, Timeouts
from shardcache.origins.listing import ListQuery, ListVersion, list_objects
from shardcache.origins.receivers import ReceiverPool

log = logging.getLogger("shardcache.daemon")
# S3's rules for a bucket name (3 to 63 lowercase letters, digits, dots and hyphens).
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
REFUSED_FOR_S = 60.0
MAX_REFUSED = 1024  # bucket names remembered as refused (the oldest forgotten first)
# New names tried a minute: each builds a boto3 client (0.3-0.5 s of a worker thread, whose
# GIL hand-offs delay every hit) and asks the store, so a client naming made-up buckets
# must not buy that without bound. Past it: SlowDown (QueueFull), try again later.
TRIES_PER_MINUTE = 20


class BucketsOnDemand:
    def __init__(
        self,
        limit: int,
        table: OriginTable,
        timeouts: Timeouts,
        receivers: ReceiverPool,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._table = table
        self._timeouts = timeouts
        self._receivers = receivers
        self._metrics = metrics
        self._clock = clock
        self.made: dict[str, ConfiguredOrigin] = {}
        self._refused: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = asyncio.Lock()
        self._tried_at: collections.deque[float] = collections.deque()  # the last minute's

    async def add(self, bucket: str) -> bool:
        """Make `bucket` an origin if it may be one; return whether one is named so now.

        Raises UnknownOrigin when none may be made (a name no bucket can have, the limit
        reached, refused a moment ago), or the store's answer to the listing
        (BucketNotFound, OriginDenied, …)."""
        if self._limit == 0:
            return False
        try:
            if not BUCKET_NAME.match(bucket):
                raise InvalidKey(f"{bucket!r} is no S3 bucket name")
            validate_origin_name(bucket)
        except InvalidKey as exc:
            raise UnknownOrigin(str(exc)) from None
        async with self._lock:  # one origin per bucket, however many ask at once
            if self._table.get(bucket) is not None:
                return True
            refused_at = self._refused.get(bucket)
            if refused_at is not None and self._clock() - refused_at < REFUSED_FOR_S:
                raise UnknownOrigin(f"bucket {bucket!r} was refused in the last minute")
            if len(self.made) >= self._limit:
                raise UnknownOrigin(
                    f"no origin for bucket {bucket!r}: the {self._limit} buckets "
                    "--s3-buckets-on-demand allows are taken"
                )
            self._count_try(bucket)
            spec = OriginSpec(bucket, f"s3://{bucket}")
            origin = await asyncio.to_thread(  # boto3: slow
                make_origin, spec, self._timeouts, self._receivers
            )
            try:
                await list_objects(origin, ListQuery(ListVersion.V2, max_keys=1))
            except OriginError:
                await _close(origin)
                self._refuse(bucket)
                raise
            configured = ConfiguredOrigin(
                origin, spec, shown_url=spec.url, home_label=redact_url(spec.url)
            )
            self.made[bucket] = configured
            self._table.replace({**self._current(), bucket: configured})
            self._metrics.touch([bucket])
            log.info(
                "bucket %s: an origin made on first use (%d of %d)",
                bucket,
                len(self.made),
                self._limit,
            )
            return True

    def _count_try(self, bucket: str) -> None:
        """Count a new name tried now; raise QueueFull past TRIES_PER_MINUTE in a minute."""
        now = self._clock()
        while self._tried_at and now - self._tried_at[0] >= 60.0:
            self._tried_at.popleft()
        if len(self._tried_at) >= TRIES_PER_MINUTE:
            raise QueueFull(
                f"bucket {bucket!r}: {TRIES_PER_MINUTE} new buckets were tried in the last "
                "minute; try again later"
            )
        self._tried_at.append(now)

    def kept_over(self, configured: dict[str, ConfiguredOrigin]) -> dict[str, ConfiguredOrigin]:
        """`configured` (a reload's table) with the origins made here that it does not name;
        those it names now are forgotten here (the configuration's own serves them)."""
        for name in [name for name in self.made if name in configured]:
            del self.made[name]
        return {**configured, **self.made}

    def _current(self) -> dict[str, ConfiguredOrigin]:
        return {
            name: slot.configured
            for name in self._table.origins
            if (slot := self._table.get(name)) is not None
        }

    def _refuse(self, bucket: str) -> None:
        self._refused[bucket] = self._clock()
        self._refused.move_to_end(bucket)
        while len(self._refused) > MAX_REFUSED:
            self._refused.popitem(last=False)


async def _close(origin: Origin) -> None:
    try:
        await origin.aclose()
    except Exception:
        log.exception("closing the origin of a refused bucket failed")
