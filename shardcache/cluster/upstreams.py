"""`FailoverOrigin`: one origin served by several upstreams, asked in order, each behind a
circuit breaker: the tier members by rendezvous rank, then the mirrors, then the home.

The home names the object in the cache; a resume on another upstream uses If-Match, so versions
never splice; bytes failing verification count against their sender. It knows nothing of the
cache. The failover rules at length: docs/architecture.md."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

from shardcache.checksums import Checksum
from shardcache.cluster.breaker import BreakerState, Health
from shardcache.cluster.rendezvous import rank
from shardcache.cluster.tier import TierMembers, Upstream
from shardcache.errors import (
    IntegrityError,
    OriginChanged,
    OriginError,
    OriginHeadUnsupported,
    OriginShed,
    OriginThrottled,
    OriginTimeout,
    OriginUnavailable,
    OriginUntrusted,
)
from shardcache.origins.base import (
    NEW_REQUEST,
    Landed,
    ObjectInfo,
    Origin,
    OriginStream,
    RequestContext,
    SpeedFloor,
    Timeouts,
)
from shardcache.origins.listing import Listing, ListQuery, list_objects
from shardcache.origins.location import bucket_location
from shardcache.origins.streams import StreamWrapper

log = logging.getLogger("shardcache.origin")
T = TypeVar("T")
# A read cancelled after this share of the read timeout without a byte was the fill's own stall
# timeout (which fires just before any the stream could set): the upstream stalled.
STALL_SHARE = 0.9
# One request's failover stops asking tier members and mirrors after this many read timeouts
# (the home is always asked): with every member hung, a request must not wait on each in turn.
FAILOVER_BUDGET = 2
# (key, a mirror's ETag of its own) -> the home's ETag of the version the home's checksums
# vouch for, remembered for this many objects (the oldest forgotten first).
MAX_OWN_ETAGS = 4096


class FailoverOrigin:
    """An `Origin` over `chain` (the configured URLs, home last) and an optional tier."""

    def __init__(
        self,
        name: str,
        chain: Sequence[Upstream],
        tier: TierMembers | None = None,
        *,
        timeouts: Timeouts,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`timeouts`: the fetch policy's. Its read timeout bounds one request's failover
        (FAILOVER_BUDGET of them) and tells an upstream's stall; its speed floor is that of an
        iterated body (an object streamed through), so a dripping upstream is marked down
        there too; landed bodies get theirs from the fill."""
        if not chain:
            raise ValueError("an origin needs at least one upstream")
        self.name = name
        self._chain = list(chain)
        self._tier = tier
        self._read_timeout_s = timeouts.read_s
        self._min_bytes_per_s = timeouts.min_bytes_per_s
        self._clock = clock
        self._home_etags: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()

    @property
    def home(self) -> Origin:
        return self._chain[-1].origin

    @property
    def tier(self) -> TierMembers | None:
        """The tier that shares this origin's keys, if it has one."""
        return self._tier

    def url_for(self, key: str) -> str:
        return self.home.url_for(key)

    async def order(self, key: str) -> list[Upstream]:
        """Who to ask for `key`: tier members by rank, then the chain; the ones marked down
        after all the others, in the same relative order."""
        ranked: list[Upstream] = []
        if self._tier is not None:
            members = await self._tier.current()
            ranked = [members[url] for url in rank(key, members)]
        everyone = ranked + self._chain
        return [u for u in everyone if not u.breaker.is_open] + [
            u for u in everyone if u.breaker.is_open
        ]

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        """The object's info, with the checksums its body is verified against.

        The checksums of the home win: when the first answer comes from a tier member or a
        mirror, the upstreams behind it are asked in turn (the home last) for the checksums
        of the same version. A mirror or member that serves other bytes under the right
        length and ETag, with or without a checksum of its own, is then caught by the
        home's. Only when the home cannot be asked are the answering upstream's own
        checksums used (a tier member publishes the ones it verified against); with none of
        those either, raise OriginUnavailable: a body nobody can vouch for is not served.
        An answer that says it publishes none (the home answered without one) leaves the
        length, as with a single origin."""
        upstream, info, _ = await self._first_answer(
            key,
            lambda origin: origin.head(key, context=context),
            carries_bytes=False,
            is_continuing=context.is_continuing,
        )
        if upstream is self._chain[-1]:
            return info
        own = _named(info.checksums, upstream.role)
        behind, home_answered, home_error, vouched = await self._checksums_from_behind(
            key, info, upstream, context
        )
        if behind:
            # A mirror's ETag of its own is no validator of the object: no 304 is answered
            # from it, and a fill's GET from the mirror is still compared by length.
            return dataclasses.replace(info, checksums=behind, etag=info.etag if vouched else None)
        if home_answered or own:
            return dataclasses.replace(info, checksums=own)
        raise OriginUnavailable(
            f"{key}: the {upstream.role}'s answer publishes no checksum and the home could not "
            f"be asked for one ({home_error}): not served unverified"
        )

    async def _checksums_from_behind(
        self, key: str, info: ObjectInfo, answered: Upstream, context: RequestContext
    ) -> tuple[tuple[Checksum, ...], bool, OriginError | None, bool]:
        """The checksums of the first upstream after `answered` that publishes any for the
        version `info` describes, each named by where it came from (`X-Shardcache-Verified`);
        whether the home answered its HEAD; the home's error when it did not; and whether
        `info`'s ETag is the object's (False for a mirror's ETag of its own). Raise
        OriginChanged when an upstream describes another version than `answered` (a mirror's
        ETag of its own aside, where checksums will judge its bytes)."""
        order = await self.order(key)
        home = self._chain[-1]
        behind = order[order.index(answered) + 1 :] if answered in order else order
        asked = [u for u in behind if not u.breaker.is_open and u is not home] + [home]
        deadline = self._clock() + FAILOVER_BUDGET * self._read_timeout_s
        home_error: OriginError | None = None
        for upstream in asked:
            if self._clock() >= deadline and upstream is not home:
                continue
            sent_at = self._clock()
            upstream.breaker.sending(carries_bytes=False)
            try:
                try:
                    other = await upstream.origin.head(key, context=context)
                except OriginHeadUnsupported:
                    if upstream is not home:
                        raise
                    # The home refuses HEAD (a presigned GET-only URL, say) but may publish
                    # its checksum on GET: read a GET's headers only, then close it.
                    other = await self._headers_of_get(upstream.origin, key, context)
            except OriginError as exc:
                if isinstance(exc, OriginShed):
                    pass  # our threads, or its gate, were busy: nothing said of its health
                elif _is_upstream_failure(exc):
                    self.note_failure(upstream, exc, sent_at)
                else:
                    self.note_success(upstream, sent_at)
                if upstream is home:
                    home_error = exc
                log.debug(
                    "origin %s: no checksum for %s from %s: %s", self.name, key, upstream.role, exc
                )
                continue
            self.note_success(upstream, sent_at)
            change = info.differs_from(other)
            is_own_etag = change is not None and _etags_are_its_own(answered, info, other)
            if is_own_etag:
                change = None  # `other`'s checksums judge the mirror's bytes
            if change is not None:
                disagree = OriginChanged(
                    f"{key}: the {answered.role} and the {upstream.role} disagree: {change}"
                )
                if upstream is home:  # the home names the object: the other one is stale
                    self.note_failure(answered, disagree, self._clock())
                raise disagree
            if other.checksums:
                if is_own_etag and upstream is home:
                    self._remember_home_etag(key, info, other)
                return (
                    _named(other.checksums, upstream.role),
                    upstream is home,
                    None,
                    not is_own_etag,
                )
        return (), home_error is None, home_error, True

    def _remember_home_etag(self, key: str, info: ObjectInfo, home: ObjectInfo) -> None:
        """`info` (a mirror's answer) carries an ETag of its own and the home's checksums (of
        `home`, its HEAD) judge its bytes: a fill of it that resumes from the home asks
        If-Match on the home's ETag, not the mirror's (which the home would refuse as another
        version, failing the reader where the home could finish the object)."""
        if info.strong_etag is None or home.strong_etag is None:
            return
        self._home_etags[(key, info.strong_etag)] = home.strong_etag
        self._home_etags.move_to_end((key, info.strong_etag))
        while len(self._home_etags) > MAX_OWN_ETAGS:
            self._home_etags.popitem(last=False)

    @staticmethod
    async def _headers_of_get(origin: Origin, key: str, context: RequestContext) -> ObjectInfo:
        """What a whole-object GET of `key` says of it, without its body (closed unread)."""
        stream = await origin.open(key, context=context)
        try:
            return stream.info
        finally:
            await stream.aclose()

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> OriginStream:
        """Open from the first upstream that answers. A tier member's or mirror's answer
        loses the checksums it carries: the fill asks `head`, where the home's win."""
        home = self._chain[-1]
        home_etag = self._home_etags.get((key, if_match)) if if_match is not None else None

        def ask(origin: Origin) -> Awaitable[OriginStream]:
            if home_etag is not None and origin is home.origin:
                return origin.open(key, start, end, home_etag, context=context)
            return origin.open(key, start, end, if_match, context=context)

        upstream, stream, sent_at = await self._first_answer(
            key, ask, is_continuing=context.is_continuing
        )
        watched = WatchedStream(stream, upstream, self, sent_at)
        if upstream is home and home_etag is not None:
            # A resume of a mirror's answer (its ETag its own) from the home, asked If-Match
            # on the home's ETag of the version whose checksums judge the whole body: the
            # same version, shown under the ETag the first answer carried.
            watched.info = dataclasses.replace(watched.info, etag=if_match)
        if upstream is not self._chain[-1] and watched.info.checksums:
            watched.info = dataclasses.replace(watched.info, checksums=())
        return watched

    async def _first_answer(
        self,
        key: str,
        ask: Callable[[Origin], Awaitable[T]],
        carries_bytes: bool = True,
        is_continuing: bool = False,
    ) -> tuple[Upstream, T, float]:
        """Ask each upstream that is not marked down in turn, and the home last whatever its
        state, until one answers. The others are asked for FAILOVER_BUDGET read timeouts at
        most (a request never waits on every hung member in turn), the home always. Raise the
        last failure when none answers, or at once a definite answer (not found, changed) or a
        tier member's throttling or shed (unless `is_continuing`: the request continues an
        answer under way, never shed). `carries_bytes`: a GET (a HEAD is no probe of an upstream
        marked down for bad bytes: see `breaker`)."""
        order = await self.order(key)
        home = self._chain[-1]
        asked = [u for u in order if not u.breaker.is_open and u is not home] + [home]
        deadline = self._clock() + FAILOVER_BUDGET * self._read_timeout_s
        last: OriginError | None = None
        for upstream in asked:
            if last is not None and self._clock() >= deadline and upstream is not home:
                continue  # out of time for the others: the home still gets its turn
            sent_at = self._clock()
            upstream.breaker.sending(carries_bytes)
            try:
                answer = await ask(upstream.origin)
            except OriginError as exc:
                if isinstance(exc, OriginShed):
                    if upstream.role == "tier" and not exc.is_local and not is_continuing:
                        raise  # its cap guards the store the members share: not gone around
                    last = exc  # our threads, or its gate, were busy: nothing said of its health
                    continue  # (an answer under way is never shed: the next is asked)
                if isinstance(exc, OriginThrottled) and upstream.role == "tier":
                    raise  # members share one store: see the module docstring
                if not _is_upstream_failure(exc):
                    self.note_success(upstream, sent_at)  # it answered: gone, or changed
                    raise
                self.note_failure(upstream, exc, sent_at)
                last = exc
                continue
            self.note_success(upstream, sent_at)
            return upstream, answer, sent_at
        assert last is not None
        raise last

    def note_success(self, upstream: Upstream, sent_at: float, proves_bytes: bool = False) -> None:
        """`upstream` answered a request sent at `sent_at` (`proves_bytes`: and the body it
        sent verified)."""
        left = upstream.breaker.succeeded(sent_at, proves_bytes)
        if left is not None:
            log.warning(
                "origin %s: %s %s is up again", self.name, upstream.role, upstream.breaker.upstream
            )

    def note_failure(
        self, upstream: Upstream, exc: Exception, sent_at: float, is_integrity: bool = False
    ) -> None:
        """Mark `upstream` down; logged when it goes down, not at each failed probe after.
        `is_integrity`: the bytes it sent failed verification."""
        left = upstream.breaker.failed(str(exc), sent_at, is_integrity)
        level = logging.WARNING if left is BreakerState.CLOSED else logging.DEBUG
        log.log(
            level,
            "origin %s: %s %s is down (%s); asking the next upstream, and this one again in %.0f s",
            self.name,
            upstream.role,
            upstream.breaker.upstream,
            exc,
            upstream.breaker.backoff_s,
        )

    def health(self) -> list[tuple[str, Health]]:
        """(role, health) of every upstream: tier members by URL, then the chain in order."""
        rows: list[tuple[str, Health]] = []
        if self._tier is not None:
            for url in sorted(self._tier.members):
                rows.append(("tier", self._tier.members[url].breaker.health()))
        rows += [(u.role, u.breaker.health()) for u in self._chain]
        return rows

    async def list_objects(self, query: ListQuery) -> Listing:
        """A page of the home's keys: mirrors and tier members serve objects, not lists."""
        return await list_objects(self.home, query)

    async def bucket_location(self) -> str:
        """The home's bucket's region: mirrors and tier members hold copies, not buckets."""
        return await bucket_location(self.home)

    async def aclose(self) -> None:
        if self._tier is not None:
            await self._tier.aclose()
        for upstream in self._chain:
            await upstream.origin.aclose()


def _named(checksums: tuple[Checksum, ...], role: str) -> tuple[Checksum, ...]:
    """`checksums`, each saying which upstream published it ("Content-MD5 (home)")."""
    return tuple(dataclasses.replace(c, source=f"{c.source} ({role})") for c in checksums)


def _etags_are_its_own(answered: Upstream, info: ObjectInfo, other: ObjectInfo) -> bool:
    """Whether `info` (a mirror's answer) differs from `other` (an upstream behind it) in its
    ETag alone while `other` publishes checksums. A mirror is another store, and its ETags are
    its own: SeaweedFS gives a remote-mounted object its own ETag once it has cached it. Its
    bytes are then judged by `other`'s checksums (a stale copy fails them and is counted as
    bytes that did not verify), not refused for a name. A tier member passes the origin's ETag
    on, so another one from it is another version; so is any ETag where no checksum can tell."""
    if answered.role != "mirror" or not other.checksums:
        return False
    return info.differs_from(dataclasses.replace(other, etag=None)) is None


def _is_upstream_failure(exc: OriginError) -> bool:
    """Whether `exc` says the upstream is unwell (connect failure, 5xx, stall, a body cut
    short), so the next one should be asked; not found, changed or refused are answers."""
    if isinstance(exc, OriginUntrusted):
        return True  # this upstream's certificate; the next one may well verify
    return exc.is_retryable and isinstance(exc, OriginUnavailable | OriginTimeout)


class UpstreamSender:
    """The `Sender` of one response from a tier member or mirror: the fill's verdict on the
    bytes it landed from it reaches that upstream's breaker."""

    def __init__(self, upstream: Upstream, owner: FailoverOrigin, sent_at: float) -> None:
        self.name = f"{upstream.role} {upstream.breaker.upstream}"
        self._upstream = upstream
        self._owner = owner
        self._sent_at = sent_at

    def bytes_failed(self, reason: str) -> None:
        failure = IntegrityError(f"sent bytes that did not verify: {reason}")
        self._owner.note_failure(self._upstream, failure, self._sent_at, is_integrity=True)

    def bytes_verified(self) -> None:
        self._owner.note_success(self._upstream, self._sent_at, proves_bytes=True)


class WatchedStream(StreamWrapper):
    """An upstream's stream that marks the upstream down when its body fails or stalls, so the
    fill's resumed request goes to the next upstream. It watches both ways a body is taken:
    iterated (`chunks`, held to the speed floor here) and landed (`landing`, held to it by the
    landing itself)."""

    def __init__(
        self, inner: OriginStream, upstream: Upstream, owner: FailoverOrigin, sent_at: float
    ) -> None:
        info = inner.info
        if upstream is not owner._chain[-1]:  # the home's bytes are judged by its own checksum
            info = dataclasses.replace(inner.info, sent_by=UpstreamSender(upstream, owner, sent_at))
        super().__init__(inner, info)
        self._upstream = upstream
        self._owner = owner
        self._sent_at = sent_at

    async def chunks(self) -> AsyncIterator[bytes]:
        chunks = aiter(self.inner)
        waiting_since = self._owner._clock()

        def silent_since() -> float:
            return waiting_since

        floor = SpeedFloor(self._owner._min_bytes_per_s, self._owner._read_timeout_s)
        while True:
            waiting_since = self._owner._clock()
            with self._noting_failures(silent_since):
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                floor.passed(len(chunk), self._upstream.breaker.upstream)
            yield chunk

    @contextlib.contextmanager
    def landing(self, landed: Landed) -> Iterator[Landed]:
        last_byte_at = self._owner._clock()

        def noted(count: int) -> None:  # on the landing thread
            nonlocal last_byte_at
            last_byte_at = self._owner._clock()
            landed(count)

        with self._noting_failures(lambda: last_byte_at):
            yield noted

    @contextlib.contextmanager
    def _noting_failures(self, last_byte_at: Callable[[], float]) -> Iterator[None]:
        """Mark the upstream down when the body fails, or when it is cancelled after a
        silence near the read timeout (a fill's own timer fired first: a stall)."""
        try:
            yield
        except OriginError as exc:
            if _is_upstream_failure(exc):
                self._owner.note_failure(self._upstream, exc, self._sent_at)
            raise
        except asyncio.CancelledError:
            silent_s = self._owner._clock() - last_byte_at()
            if silent_s >= STALL_SHARE * self._owner._read_timeout_s:
                stall = OriginTimeout(f"no byte for {silent_s:.1f}s")
                self._owner.note_failure(self._upstream, stall, self._sent_at)
            raise


__all__ = [
    "BreakerState",
    "FailoverOrigin",
    "TierMembers",
    "Upstream",
    "UpstreamSender",
    "WatchedStream",
]
