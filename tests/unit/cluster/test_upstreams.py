"""Failover across an origin's upstreams, tier ranking and the circuit breaker: in memory, with
a fake clock and fake origins (the multi-daemon tests in tests/integration/test_sharded_tier.py
and test_tiers.py drive the same code over real sockets)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from pathlib import Path

import pytest

from shardcache.cache.fill import FillState
from shardcache.cache.lease import Result
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.cluster.breaker import BreakerState, CircuitBreaker, Health
from shardcache.cluster.rendezvous import rank
from shardcache.cluster.tier import TierMembers, Upstream
from shardcache.cluster.upstreams import FailoverOrigin
from shardcache.config import OriginSpec
from shardcache.errors import (
    IntegrityError,
    OriginChanged,
    OriginNotFound,
    OriginShed,
    OriginThrottled,
    OriginTimeout,
    OriginUnavailable,
)
from shardcache.fetch.origin_table import ConfiguredOrigin
from shardcache.observer import NullObserver
from shardcache.origins.base import CONTINUED_REQUEST, Origin
from shardcache.origins.receivers import ReceiverPool
from tests.unit.cache.test_shard_cache import read_all
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy, make_timeouts
from tests.unit.waiting import until

MiB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def upstream(origin: Origin, clock: Clock, role: str = "mirror") -> Upstream:
    return Upstream(origin, CircuitBreaker(origin.name, clock), role)


def test_breaker_opens_backs_off_doubling_and_closes_on_success() -> None:
    clock = Clock()
    breaker = CircuitBreaker("u", clock, base_s=1, cap_s=4)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.failed("refused") is BreakerState.CLOSED  # opened just now: log it
    assert breaker.is_open and breaker.backoff_s == 1
    clock.now += 1
    assert breaker.state is BreakerState.HALF_OPEN  # the next request is the probe
    assert breaker.failed("refused again") is BreakerState.HALF_OPEN
    assert breaker.backoff_s == 2
    for _ in range(5):
        clock.now += 10
        breaker.failed("still refused")
    assert breaker.backoff_s == 4  # capped
    assert breaker.failed("while open") is None  # no second log line while open
    clock.now += 4
    assert breaker.succeeded() is BreakerState.HALF_OPEN
    assert breaker.state is BreakerState.CLOSED and breaker.succeeded() is None
    assert breaker.health().failures_total == 8
    sent = clock.now
    clock.now += 0.5
    breaker.failed("refused")
    assert breaker.succeeded(sent_at=sent) is None  # sent before the failure: no news
    assert breaker.is_open


def test_rendezvous_shares_keys_evenly_and_moves_only_the_lost_members_share() -> None:
    members = [f"http://sc-{i}.sc:8470" for i in range(3)]
    keys = [f"shard-{i:05d}.tar" for i in range(3000)]
    owners = {key: rank(key, members)[0] for key in keys}
    shares = collections.Counter(owners.values())
    assert all(900 <= n <= 1100 for n in shares.values()), shares
    survivors = members[:2]
    moved = [k for k in keys if rank(k, survivors)[0] != owners[k]]
    assert all(owners[k] == members[2] for k in moved)  # only the lost member's keys move
    assert len(moved) == shares[members[2]]
    # …to the member ranked next for each key, which every node computes alike
    assert all(rank(k, survivors)[0] == rank(k, members)[1] for k in moved)
    grown = members + ["http://sc-3.sc:8470"]
    gained = [k for k in keys if rank(k, grown)[0] != owners[k]]
    assert all(rank(k, grown)[0] == grown[3] for k in gained)
    assert 600 <= len(gained) <= 900  # about a quarter


async def test_a_failing_upstream_is_skipped_until_its_back_off_ends() -> None:
    clock = Clock()
    first, second = FakeOrigin("first"), FakeOrigin("second")
    for origin in (first, second):
        origin.put("k", b"x" * 100)
    first.open_failures["k"] = 1
    failover = FailoverOrigin(
        "o",
        [upstream(first, clock), upstream(second, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    stream = await failover.open("k")
    assert b"".join([c async for c in stream]) == b"x" * 100
    assert len(first.opens) == 1 and len(second.opens) == 1
    await failover.open("k")
    assert len(first.opens) == 1 and len(second.opens) == 2  # skipped while down
    health = dict((h.upstream, h) for _, h in failover.health())
    assert health["first"].state is BreakerState.OPEN and health["second"].failures_total == 0
    clock.now += 1.0
    await failover.open("k")  # the probe: it answers, and is first again
    assert len(first.opens) == 2
    assert health["first"].upstream == "first"
    assert dict((h.upstream, h.state) for _, h in failover.health())["first"] is (
        BreakerState.CLOSED
    )


async def test_every_upstream_down_asks_the_home_alone_and_raises_its_failure() -> None:
    clock = Clock()
    first, second = FakeOrigin("first"), FakeOrigin("second")
    first.put("k", b"x")
    second.put("k", b"x")
    first.open_failures["k"] = 5
    second.open_failures["k"] = 5
    failover = FailoverOrigin(
        "o",
        [upstream(first, clock), upstream(second, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    with pytest.raises(OriginUnavailable):
        await failover.open("k")
    with pytest.raises(OriginUnavailable):
        await failover.open("k")  # both down: the home is asked rather than failing blind
    assert len(first.opens) == 1 and len(second.opens) == 2
    clock.now += 2.5  # the home's back-off is 2 s now, the mirror's 1 s: both probed again
    second.open_failures["k"] = 0
    await failover.open("k")
    assert len(first.opens) == 2 and len(second.opens) == 3


class Hung(FakeOrigin):
    """An upstream that accepts and never answers: each request times out (the transport's
    own answer timeout, `timeout_s`)."""

    timeout_s = 0.1

    async def open(self, key: str, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        self.opens.append((key, 0))
        await asyncio.sleep(self.timeout_s)
        raise OriginTimeout(f"{self.name}: timed out")


async def test_a_request_gives_up_after_two_read_timeouts_however_many_upstreams_hang() -> None:
    hung = [Hung(f"m{i}") for i in range(6)]
    failover = FailoverOrigin(
        "o", [upstream(h, Clock()) for h in hung], timeouts=make_timeouts(Hung.timeout_s)
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(OriginTimeout):
        await failover.open("k")
    assert loop.time() - started < 0.45  # not six timeouts in turn
    assert sum(len(h.opens) for h in hung) == 3  # two within the budget, then the home
    assert len(hung[-1].opens) == 1


async def test_hung_tier_members_never_keep_a_request_from_a_healthy_home() -> None:
    members = {f"http://m{i}:8470": Hung(f"m{i}") for i in range(10)}
    home = FakeOrigin("home")
    home.put("k", b"x")
    tier = TierMembers(lambda url: members[url], list(members))
    failover = FailoverOrigin(
        "o", [upstream(home, Clock())], tier, timeouts=make_timeouts(Hung.timeout_s)
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream = await failover.open("k")  # two members' timeouts, then the home answers
    assert b"".join([c async for c in stream]) == b"x"
    assert loop.time() - started < 0.35
    assert sum(len(m.opens) for m in members.values()) == 2


class Stopped(FakeOrigin):
    """An upstream that accepts connections and answers nothing until `resume` is set (a
    process stopped with SIGSTOP)."""

    resume: asyncio.Event | None = None
    hanging = 0  # opens waiting for `resume` now

    async def open(self, key: str, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        if self.resume is not None:
            self.hanging += 1
            try:
                await self.resume.wait()
            finally:
                self.hanging -= 1
        return await super().open(key)


async def test_after_a_back_off_one_request_probes_and_the_others_keep_skipping() -> None:
    clock = Clock()
    stopped, home = Stopped("stopped"), FakeOrigin("home")
    for origin in (stopped, home):
        origin.put("k", b"x")
    stopped.open_failures["k"] = 1
    failover = FailoverOrigin(
        "o",
        [upstream(stopped, clock), upstream(home, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    await failover.open("k")  # refused: down for 1 s
    clock.now += 1.5
    stopped.resume = asyncio.Event()
    probe = asyncio.ensure_future(failover.open("k"))  # the probe: it hangs
    await until("the probe reaches the stopped upstream", lambda: stopped.hanging == 1)
    for _ in range(3):
        await failover.open("k")
    assert len(stopped.opens) == 1 and len(home.opens) == 4  # the others went past it
    stopped.resume.set()
    await probe  # it answered: up again, asked first
    await failover.open("k")
    assert len(stopped.opens) == 3 and len(home.opens) == 4


def test_failures_of_requests_sent_before_the_breaker_opened_are_one_outage() -> None:
    clock = Clock()
    breaker = CircuitBreaker("u", clock)
    sent = clock.now
    clock.now += 0.1
    assert breaker.failed("refused", sent) is BreakerState.CLOSED
    for _ in range(5):  # the other requests sent together with the first
        assert breaker.failed("refused", sent) is None
    assert breaker.backoff_s == 1.0 and breaker.health().failures_in_a_row == 1
    assert breaker.health().failures_total == 6


async def test_definite_answers_and_a_throttling_tier_do_not_fail_over() -> None:
    clock = Clock()
    first, second = FakeOrigin("first"), FakeOrigin("second")
    second.put("k", b"x")
    failover = FailoverOrigin(
        "o",
        [upstream(first, clock), upstream(second, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    with pytest.raises(OriginNotFound):
        await failover.head("k")  # the first upstream's 404 is the answer
    assert second.heads["k"] == 0

    class Throttling(FakeOrigin):
        async def head(self, key: str, **kwargs: object) -> object:  # type: ignore[override]
            raise OriginThrottled("503 SlowDown", 1.0)

    tier = TierMembers(lambda url: Throttling(url), ["http://member:8470"])
    failover = FailoverOrigin(
        "o", [upstream(second, clock)], tier, clock=clock, timeouts=make_timeouts()
    )
    with pytest.raises(OriginThrottled):
        await failover.head("k")
    assert second.heads["k"] == 0  # asking elsewhere would multiply what the store refuses
    mirrored = FailoverOrigin(
        "o",
        [upstream(Throttling("mirror"), clock), upstream(second, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    assert (await mirrored.head("k")).size_bytes == 1  # a mirror's limit is its own


async def test_an_upstream_that_sheds_is_not_marked_down_and_a_member_not_gone_around() -> None:
    """A tier member's or mirror's 503 "busy" (its gate shed the request: a cap on the store)
    says nothing of its health. Found: the node marked the member down and asked the store
    itself, around the member's cap."""
    clock = Clock()
    home = FakeOrigin("home")
    home.put("k", b"x")

    class Shedding(FakeOrigin):
        async def head(self, key: str, **kwargs: object) -> object:  # type: ignore[override]
            raise OriginShed("member: busy", 2.0)

    tier = TierMembers(lambda url: Shedding(url), ["http://member:8470"])
    failover = FailoverOrigin(
        "o", [upstream(home, clock)], tier, clock=clock, timeouts=make_timeouts()
    )
    with pytest.raises(OriginShed):
        await failover.head("k")
    assert home.heads["k"] == 0  # the member's cap guards the store the members share
    continued = await failover.head("k", context=CONTINUED_REQUEST)
    assert continued.size_bytes == 1  # an answer under way is never shed: the home is asked
    assert all(h.state is BreakerState.CLOSED for _, h in failover.health())
    mirror = upstream(Shedding("mirror"), clock)
    mirrored = FailoverOrigin(
        "o", [mirror, upstream(home, clock)], clock=clock, timeouts=make_timeouts()
    )
    assert (await mirrored.head("k")).size_bytes == 1  # a mirror's cap is its own
    assert not mirror.breaker.is_open


async def test_a_fill_failing_mid_object_resumes_from_the_next_upstream(tmp_path: Path) -> None:
    clock = Clock()
    data = bytes(range(256)) * 4096  # 1 MiB
    first, second = FakeOrigin("first"), FakeOrigin("second")
    for origin in (first, second):
        origin.put("k", data)
        origin.accepts_ranges = True
    first.fail_at["k"] = 300_000
    first.failures_left["k"] = 1
    failover = FailoverOrigin(
        "o",
        [upstream(first, clock), upstream(second, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    cache = ShardCache(
        Store(tmp_path / "c", 8 * MiB),
        {"o": failover},
        make_policy(retries=2, base_s=0.001, connections=1),
        NullObserver(),
    )
    try:
        assert await read_all(await cache.open("o", "k")) == data
        assert first.ranges == [("k", 0, None)]
        assert [start for _, start, _ in second.ranges] == [300_000]  # resumed, not from 0
    finally:
        await cache.aclose()


async def test_a_resumed_object_that_differs_between_upstreams_fails_instead_of_splicing(
    tmp_path: Path,
) -> None:
    clock = Clock()
    first, second = FakeOrigin("first"), FakeOrigin("second")
    first.put("k", b"A" * MiB)
    # Another version: another ETag, and no checksum to judge the first's bytes by (with one,
    # the first's ETag may be its own: test_mirror_etag_attacks resumes and verifies).
    second.put("k", b"B" * MiB, with_md5=False)
    first.fail_at["k"] = 300_000
    first.failures_left["k"] = 1
    for origin in (first, second):
        origin.accepts_ranges = True
    failover = FailoverOrigin(
        "o",
        [upstream(first, clock), upstream(second, clock)],
        clock=clock,
        timeouts=make_timeouts(),
    )
    store = Store(tmp_path / "c", 8 * MiB)
    cache = ShardCache(
        store, {"o": failover}, make_policy(retries=2, base_s=0.001, connections=1), NullObserver()
    )
    try:
        with pytest.raises(OriginChanged):
            await read_all(await cache.open("o", "k"))
        # Refused when the home's HEAD (asked for its checksum) describes another version,
        # or at the resume (If-Match); never a splice.
        assert [start for _, start, _ in second.ranges] in ([], [300_000])
        assert store.usage().entries == 0  # nothing spliced was committed
    finally:
        await cache.aclose()


async def test_a_stalled_body_marks_its_upstream_down(caplog: pytest.LogCaptureFixture) -> None:
    first, second = FakeOrigin("first"), FakeOrigin("second")
    first.put("k", b"x" * 10_000)
    second.put("k", b"x" * 10_000)
    first.gate = asyncio.Event()  # never set: the body never comes
    failover = FailoverOrigin(
        "o", [upstream(first, Clock()), upstream(second, Clock())], timeouts=make_timeouts(0.2)
    )
    stream = await failover.open("k")
    caplog.set_level(logging.WARNING, "shardcache.origin")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):  # the fill's own read timeout (`with_read_timeout`)
            await anext(aiter(stream))
    await stream.aclose()
    assert [h.state for _, h in failover.health()][0] is BreakerState.OPEN
    assert "first is down (no byte for" in caplog.text
    assert caplog.text.count("is down") == 1


async def test_a_quick_cancel_is_not_a_stall() -> None:
    first = FakeOrigin("first")
    first.put("k", b"x" * 10_000)
    first.gate = asyncio.Event()
    failover = FailoverOrigin("o", [upstream(first, Clock())], timeouts=make_timeouts(5))
    stream = await failover.open("k")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # a client that went away
            await anext(aiter(stream))
    assert [h.state for _, h in failover.health()][0] is BreakerState.CLOSED


async def test_tier_members_come_first_by_rank_then_the_chain() -> None:
    clock = Clock()
    members = {f"http://m{i}:8470": FakeOrigin(f"m{i}") for i in range(3)}
    home = FakeOrigin("home")
    tier = TierMembers(lambda url: members[url], list(members))
    failover = FailoverOrigin(
        "o", [upstream(home, clock)], tier, clock=clock, timeouts=make_timeouts()
    )
    for key in ("a", "b", "c", "d"):
        order = [u.breaker.upstream for u in await failover.order(key)]
        assert order == [*rank(key, members), "home"]
    owner = rank("a", members)[0]
    members[owner].put("a", b"z")
    assert (await failover.head("a")).size_bytes == 1
    assert members[owner].heads["a"] == 1


async def test_a_dns_tier_adopts_new_answers_and_keeps_its_members_through_a_failure() -> None:
    answers: list[list[str] | OSError] = [["10.0.0.1", "10.0.0.2"]]
    made: list[str] = []
    clock = Clock()

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("sc.ns.svc", 8470)
        answer = answers[0]
        if isinstance(answer, OSError):
            raise answer
        return answer

    def make(url: str) -> FakeOrigin:
        made.append(url)
        return FakeOrigin(url)

    tier = TierMembers(
        make, dns_url="http://sc.ns.svc:8470", refresh_s=30, resolver=resolver, clock=clock
    )
    assert set(await tier.current()) == {"http://10.0.0.1:8470", "http://10.0.0.2:8470"}
    answers[0] = OSError("Temporary failure in name resolution")
    clock.now += 31
    await tier.current()
    await asyncio.sleep(0)  # the refresh runs in the background
    assert set(tier.members) == {"http://10.0.0.1:8470", "http://10.0.0.2:8470"}
    answers[0] = ["10.0.0.2", "10.0.0.3", "fd00::1"]
    clock.now += 31
    await tier.current()
    await asyncio.sleep(0)
    assert set(tier.members) == {
        "http://10.0.0.2:8470",
        "http://10.0.0.3:8470",
        "http://[fd00::1]:8470",
    }
    assert made.count("http://10.0.0.2:8470") == 1  # a member that stays keeps its breaker


def test_tier_members_get_the_tier_headers_never_the_origins_credentials(
    receiver_pool: ReceiverPool,
) -> None:
    from shardcache.config import OriginSpec
    from shardcache.daemon.origin_factory import make_origin
    from shardcache.origins.base import Timeouts

    spec = OriginSpec(
        "o",
        "https://cdn.example/x",
        headers=(("Authorization", "Bearer cdn-secret"),),
        tier=("http://m0:8470",),
        tier_headers=(("Authorization", "Bearer tier-token"),),
    )
    failover = make_origin(spec, Timeouts(1, 1), receiver_pool)
    assert isinstance(failover, FailoverOrigin)
    assert failover.url_for("k") == "https://cdn.example/x/k"
    assert failover.tier is not None
    member = failover.tier.members["http://m0:8470"].origin
    assert member.url_for("k") == "http://m0:8470/o/k"
    sent = member.headers  # type: ignore[attr-defined]
    assert sent["Authorization"] == "Bearer tier-token"
    home = failover.home.headers  # type: ignore[attr-defined]
    assert home["Authorization"] == "Bearer cdn-secret"


def test_credentials_in_upstream_urls_never_reach_labels_logs_or_status(
    receiver_pool: ReceiverPool,
) -> None:
    from shardcache.config import OriginSpec
    from shardcache.daemon.origin_factory import make_origin
    from shardcache.origins.base import Timeouts

    spec = OriginSpec(
        "o",
        "http://home.example/x",
        mirrors=("http://user:mirror-secret@mirror.example/x?sig=query-secret",),
        tier=("http://user:tier-secret@m0:8470",),
    )
    failover = make_origin(spec, Timeouts(1, 1), receiver_pool)
    assert isinstance(failover, FailoverOrigin)
    names = [(role, health.upstream) for role, health in failover.health()]
    assert names == [
        ("tier", "http://m0:8470"),
        ("mirror", "http://mirror.example/x"),
        ("home", "http://home.example/x"),
    ]


async def test_one_request_at_once_still_streams_an_uncacheable_object_through(
    tmp_path: Path,
) -> None:
    """A stream-through opens the first part, asks a HEAD for the checksums while that part is
    open, then asks for the rest: with `max_requests = 1` it used to wait for itself forever."""
    origin = FakeOrigin("o")
    origin.accepts_ranges = True
    origin.checksums_on_get = False  # a HEAD must bring them, as from S3
    data = os.urandom(3 * MiB)
    origin.put("big", data)
    capped = ConfiguredOrigin(origin, OriginSpec("o", "http://origin", max_requests=1))
    cache = ShardCache(
        Store(tmp_path / "c", 2 * MiB),  # smaller than the object: streamed through
        {"o": capped},
        make_policy(retries=1, base_s=0.001),
        NullObserver(),
    )
    try:
        async with asyncio.timeout(10):
            assert await read_all(await cache.open("o", "big")) == data
        assert origin.heads["big"] == 1 and len(origin.opens) == 2
    finally:
        await cache.aclose()


async def test_every_first_caller_of_a_dns_tier_waits_for_its_first_resolution() -> None:
    async def slow_resolver(host: str, port: int) -> list[str]:
        await asyncio.sleep(0.05)
        return ["10.0.0.1", "10.0.0.2", "10.0.0.3"]

    tier = TierMembers(FakeOrigin, dns_url="http://sc:8470", resolver=slow_resolver)
    seen = await asyncio.gather(*(tier.current() for _ in range(8)))
    assert [len(members) for members in seen] == [3] * 8  # none went round the tier


def test_a_shardcache_503_is_throttling_only_when_it_says_so() -> None:
    from shardcache.origins.responses import raise_for_status as _raise_for_status
    from shardcache.serving.connections import REFUSAL

    refusal_headers = dict(
        line.split(": ", 1) for line in REFUSAL.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    )
    for headers, expected in (
        ({"X-Shardcache-Error": "throttled", "Retry-After": "2"}, OriginThrottled),
        ({"X-Shardcache-Error": "shutdown", "Retry-After": "5"}, OriginUnavailable),
        ({"X-Shardcache-Error": "busy", "Retry-After": "3"}, OriginShed),
        (refusal_headers, OriginUnavailable),  # a member at its connection limit
        ({"Retry-After": "2"}, OriginThrottled),  # any other server: S3's SlowDown, a CDN
    ):
        with pytest.raises(expected) as raised:
            _raise_for_status(503, "http://member/o/k", headers)
        assert type(raised.value) is expected, headers


@pytest.mark.parametrize("connections", [1, 4])
async def test_bytes_failing_the_homes_checksum_mark_the_mirror_down_and_are_fetched_again(
    connections: int, tmp_path: Path
) -> None:
    # The mirror serves other bytes under the home's ETag and length, with no checksum; the
    # home publishes its MD5. With 4 connections the body comes in segments (several GETs).
    clock = Clock()  # never advances: the mirror stays down once marked
    data = os.urandom(3 * MiB)
    mirror, home = FakeOrigin("mirror"), FakeOrigin("home")
    home.put("k", data)
    mirror.put("k", os.urandom(len(data)), with_md5=False)
    mirror.etags["k"] = home.etags["k"]
    for origin in (mirror, home):
        origin.accepts_ranges = True
    failover = FailoverOrigin(
        "o",
        [upstream(mirror, clock), upstream(home, clock, "home")],
        clock=clock,
        timeouts=make_timeouts(),
    )
    store = Store(tmp_path / "c", 16 * MiB)
    policy = make_policy(retries=2, base_s=0.001, connections=connections, segment_bytes=MiB)
    cache = ShardCache(store, {"o": failover}, policy, NullObserver())
    try:
        lease = await cache.open("o", "k")
        failed = lease.fill
        assert failed is not None and failed.task is not None
        with pytest.raises(IntegrityError):  # its reader had the mirror's bytes: it fails
            await read_all(lease)
        await failed.task
        assert failed.check.blamed == ("mirror mirror",)
        health = dict((h.upstream, h) for _, h in failover.health())
        assert health["mirror"].state is BreakerState.OPEN
        assert health["mirror"].integrity_failures_total == 1  # once per fill, not per GET
        assert "did not verify" in (health["mirror"].last_error or "")
        assert health["home"].failures_total == 0
        mirror_opens = len(mirror.opens)
        assert home.ranges and home.ranges[0][1] == 0  # fetched again from byte 0

        # The second fetch was started as the first failed: the next read joins or hits it.
        again = cache.flights.get(home.url_for("k"))
        if again is not None:
            assert again.is_second_fetch
            assert await again.wait_finished() is FillState.COMMITTED
        hit = await cache.open("o", "k")
        assert hit.result is Result.HIT
        assert await read_all(hit) == data
        assert len(mirror.opens) == mirror_opens  # nothing more asked of the liar
        assert store.check() == []
    finally:
        await cache.aclose()


async def test_a_lying_mirror_is_probed_by_a_get_and_backed_off_doubling(tmp_path: Path) -> None:
    clock = Clock()
    mirror, home = FakeOrigin("mirror"), FakeOrigin("home")
    keys = ["a", "b", "c"]
    for key in keys:
        home.put(key, os.urandom(MiB))
        mirror.put(key, os.urandom(MiB), with_md5=False)
        mirror.etags[key] = home.etags[key]
    failover = FailoverOrigin(
        "o",
        [upstream(mirror, clock), upstream(home, clock, "home")],
        clock=clock,
        timeouts=make_timeouts(),
    )
    policy = make_policy(retries=2, base_s=0.001, connections=1)
    cache = ShardCache(Store(tmp_path / "c", 16 * MiB), {"o": failover}, policy, NullObserver())

    def mirror_health() -> Health:
        return dict((h.upstream, h) for _, h in failover.health())["mirror"]

    try:
        lease = await cache.open("o", "a")
        failed = lease.fill
        assert failed is not None and failed.task is not None
        with pytest.raises(IntegrityError):
            await read_all(lease)
        await failed.task
        again = cache.flights.get(home.url_for("a"))
        assert again is not None and again.is_second_fetch  # from the home, while it is down
        assert await again.wait_finished() is FillState.COMMITTED
        assert mirror_health().retry_in_s == 1.0
        clock.now += 1.5  # its back-off ended: probing
        assert (await failover.head("b")).size_bytes == MiB  # a HEAD answers…
        assert mirror_health().state is BreakerState.HALF_OPEN  # …and closes nothing
        opens = len(mirror.opens)
        with pytest.raises(IntegrityError):  # the next GET is the probe; its bytes lie again
            await read_all(await cache.open("o", "b"))
        assert len(mirror.opens) == opens + 1
        health = mirror_health()
        assert health.state is BreakerState.OPEN and health.retry_in_s == 2.0  # doubled
        assert health.integrity_failures_total == 2
        assert await read_all(await cache.open("o", "c")) == home.objects["c"]  # skipped
        assert len(mirror.opens) == opens + 1
    finally:
        await cache.aclose()


@pytest.mark.parametrize(
    ("role", "home_md5", "accepted"),
    [("mirror", True, True), ("mirror", False, False), ("tier", True, False)],
)
async def test_a_mirror_with_etags_of_its_own_is_judged_by_the_homes_checksum(
    role: str, home_md5: bool, accepted: bool
) -> None:
    """A mirror is another store, with ETags of its own (SeaweedFS names a cached object its
    own way): where the home publishes a checksum, the mirror's answer is kept and its bytes
    are judged by that checksum. A tier member passes the origin's ETag on, and with no
    checksum an ETag is all that tells versions apart: another one there is another version."""
    clock = Clock()
    data = os.urandom(4096)
    mirror, home = FakeOrigin("mirror"), FakeOrigin("home")
    home.put("k", data, with_md5=home_md5)
    mirror.put("k", data, with_md5=False)
    mirror.etags["k"] = '"seaweedfs-own"'
    failover = FailoverOrigin(
        "o",
        [upstream(mirror, clock, role), upstream(home, clock, "home")],
        clock=clock,
        timeouts=make_timeouts(),
    )
    if accepted:
        info = await failover.head("k")
        assert [c.source for c in info.checksums] == ["fake (home)"]
        assert dict((h.upstream, h.state) for _, h in failover.health())["mirror"] is (
            BreakerState.CLOSED
        )
    else:
        with pytest.raises(OriginChanged, match="ETag changed"):
            await failover.head("k")


@pytest.mark.parametrize("cache_mib", [16, 1], ids=["cached", "streamed-through"])
async def test_a_mirrors_own_etag_answers_no_conditional_before_its_body_verified(
    cache_mib: int, tmp_path: Path
) -> None:
    """The validators a conditional GET is answered from, while a fill from a mirror with ETags
    of its own is in flight: the mirror's ETag only once the body verified and was kept; an
    object streamed through uncached leaves it to the HEAD, which names no ETag for it."""
    clock = Clock()
    data = os.urandom(2 * MiB)
    mirror, home = FakeOrigin("mirror"), FakeOrigin("home")
    home.put("k", data)
    mirror.put("k", data, with_md5=False)
    mirror.etags["k"] = '"seaweedfs-own"'
    failover = FailoverOrigin(
        "o",
        [upstream(mirror, clock), upstream(home, clock, "home")],
        clock=clock,
        timeouts=make_timeouts(),
    )
    store = Store(tmp_path / "c", cache_mib * MiB)
    policy = make_policy(retries=2, base_s=0.001, connections=1, segment_bytes=MiB)
    cache = ShardCache(store, {"o": failover}, policy, NullObserver())
    try:
        lease = await cache.open("o", "k")
        asked = asyncio.create_task(cache.head("o", "k", wants_checksums=False))
        assert await read_all(lease) == data
        result, info = await asked
        if cache_mib == 16:  # the fill in flight, or its entry once kept
            assert result in (Result.COALESCED, Result.HIT)
            assert info.etag == '"seaweedfs-own"'
        else:
            assert (result, info.etag) == (Result.MISS, None)
        assert store.check() == []
    finally:
        await cache.aclose()


async def test_every_upstream_asked_for_a_request_gets_its_context() -> None:
    """Whether a request continues an answer travels with it through failover, to a mirror
    refused, the home that answered, and the home asked for a mirror's checksums."""
    clock = Clock()
    mirror, home = FakeOrigin("mirror"), FakeOrigin("home")
    for origin in (mirror, home):
        origin.put("k", b"x")
    mirror.open_failures["k"] = 1
    failover = FailoverOrigin(
        "o",
        [upstream(mirror, clock), upstream(home, clock, "home")],
        clock=clock,
        timeouts=make_timeouts(),
    )
    stream = await failover.open("k", context=CONTINUED_REQUEST)
    await stream.aclose()
    clock.now += 1.5  # the mirror's back-off is over
    await failover.head("k", context=CONTINUED_REQUEST)  # the mirror answers, the home vouches
    assert mirror.contexts == [CONTINUED_REQUEST, CONTINUED_REQUEST]
    assert home.contexts == [CONTINUED_REQUEST, CONTINUED_REQUEST]
