"""How objects are cut into segments (pure), and what each request of a fill's retry loop
(`OriginRequests`) carries down, in its arguments: the throttling met so far and whether it
continues an answer, to the origin's gate. In memory, no sockets."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable

import pytest

from shardcache.errors import OriginShed, OriginThrottled
from shardcache.fetch.gate import GateCaps, OriginGate
from shardcache.fetch.segments import OriginRequests, Segment, plan
from shardcache.observer import NullObserver
from shardcache.origins.base import CONTINUED_REQUEST, NEW_REQUEST, OriginStream
from tests.unit.fakes import FakeOrigin, Pace
from tests.unit.policies import make_policy
from tests.unit.waiting import until

MiB = 1 << 20
POLICY = make_policy(connections=8, segment_bytes=16 * MiB, first_segment_bytes=2 * MiB)


def _bounds(segments: list[Segment]) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in segments]


def test_small_or_unranged_objects_are_one_segment() -> None:
    assert _bounds(plan(MiB, POLICY, accepts_ranges=True)) == [(0, MiB)]
    assert _bounds(plan(64 * MiB, POLICY, accepts_ranges=False)) == [(0, 64 * MiB)]


def test_mid_size_objects_use_every_connection() -> None:
    assert _bounds(plan(8 * MiB, POLICY, accepts_ranges=True)) == [
        (0, 2 * MiB),
        (2 * MiB, 4 * MiB),
        (4 * MiB, 6 * MiB),
        (6 * MiB, 8 * MiB),
    ]


def test_large_objects_use_full_segments_and_cover_every_byte_once() -> None:
    size = 1024 * MiB + 5
    segments = plan(size, POLICY, accepts_ranges=True)
    assert segments[0].end == 2 * MiB
    assert {s.end - s.start for s in segments[1:-1]} == {16 * MiB}
    assert all(a.end == b.start for a, b in zip(segments, segments[1:], strict=False))
    assert segments[-1].end == size


class Slept:
    """`asyncio.sleep` for these tests (the back-off's): records the seconds
    asked and waits none; a yield (`sleep(0)`, a fake body's) still yields."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._sleep = asyncio.sleep

    async def __call__(self, seconds: float) -> None:
        if seconds:
            self.seconds.append(seconds)
        await self._sleep(0)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> Slept:
    sleep = Slept()
    monkeypatch.setattr("asyncio.sleep", sleep)
    return sleep


class AskedGate(OriginGate):
    """The origin's gate, remembering what each request asked of it."""

    def __init__(self) -> None:
        super().__init__("fake")
        self.asked: list[tuple[float, bool]] = []  # (max_wait_s, is_urgent) per turn

    async def turn(self, max_wait_s: float = math.inf, is_urgent: bool = False) -> float:
        self.asked.append((max_wait_s, is_urgent))
        return await super().turn(max_wait_s, is_urgent)


class Counted(NullObserver):
    def __init__(self) -> None:
        self.throttled = 0

    def origin_throttled(self, origin: str) -> None:
        self.throttled += 1


def refuse_first(origin: FakeOrigin, key: str, retry_after_s: float) -> None:
    """The origin refuses the first GET of `key` as one too many (429 with Retry-After)."""

    def on_open(nth: int) -> None:
        if nth == 1:
            raise OriginThrottled("429 Too Many Requests", retry_after_s)

    origin.on_open[key] = on_open


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin()
    fake.put("a.tar", b"x" * 10_000)
    return fake


async def read(opened: Awaitable[OriginStream]) -> None:
    stream = await opened
    async for _ in stream:
        pass
    await stream.aclose()


async def test_the_throttling_a_retry_waited_out_shortens_its_next_wait_at_the_gate(
    origin: FakeOrigin, slept: Slept
) -> None:
    refuse_first(origin, "a.tar", retry_after_s=2.0)
    gate, observer = AskedGate(), Counted()
    policy = make_policy(retries=2, read_timeout_s=10.0)
    requests = OriginRequests(origin, "a.tar", policy, observer, gate)
    await read(requests.open(0, None, None))
    assert slept.seconds == [2.0]  # the Retry-After, waited out: 2 of the 10 s it may wait
    (first_wait_s, _), (second_wait_s, _) = gate.asked
    assert first_wait_s == 10.0
    assert 7.0 < second_wait_s <= 8.0  # what is left of the read timeout after the 2 s
    assert observer.throttled == 1 and gate.throttling.throttled_answers == 1
    assert origin.contexts == [NEW_REQUEST, NEW_REQUEST]  # nothing of the answer under way


async def test_a_new_readers_first_get_passes_throttling_on_a_continuing_one_waits_it_out(
    origin: FakeOrigin, slept: Slept
) -> None:
    """Both while a client reads the object: only a request continuing its answer waits out
    a Retry-After longer than the read timeout; a new reader gets it as its 503."""
    policy = make_policy(retries=2, read_timeout_s=10.0)
    gate = AskedGate()
    requests = OriginRequests(
        origin, "a.tar", policy, NullObserver(), gate, client_reading=lambda: True
    )
    refuse_first(origin, "a.tar", retry_after_s=60.0)
    with pytest.raises(OriginThrottled):
        await requests.open(0, None, None, for_new_reader=True)
    assert slept.seconds == [] and origin.contexts == [NEW_REQUEST]
    assert gate.asked == [(10.0, False)]  # sheddable, in line behind the others

    origin.on_open.clear()
    origin.opens.clear()
    refuse_first(origin, "a.tar", retry_after_s=60.0)
    await read(requests.open(5_000, None, None))
    assert slept.seconds == [30.0]  # the hint, at most RETRY_AFTER_CAP_S
    assert origin.contexts[1:] == [CONTINUED_REQUEST, CONTINUED_REQUEST]
    assert [is_urgent for _, is_urgent in gate.asked[1:]] == [True, True]


async def test_a_request_continuing_an_answer_is_never_shed_by_the_caps_a_new_one_is(
    origin: FakeOrigin,
) -> None:
    """Under a cap of 4 a second with two requests waiting, the next turn is 0.75 s off, past
    the 0.6 s read timeout: a fill's first GET and a new reader's are shed; its HEAD for
    checksums and a later segment, which continue an answer, wait their turns."""
    gate = OriginGate("fake", GateCaps(max_requests_per_second=4))
    policy = make_policy(retries=2, read_timeout_s=0.6)
    reading = False
    requests = OriginRequests(origin, "a.tar", policy, NullObserver(), gate, lambda: reading)
    await gate.turn()
    waiting = [asyncio.create_task(gate.turn()) for _ in range(2)]
    await until("two requests wait", lambda: gate.waiting == 2)
    with pytest.raises(OriginShed, match="the next turn is 1 s off"):
        await requests.open(0, None, None)  # a fill's first GET
    reading = True
    with pytest.raises(OriginShed, match="the next turn is 1 s off"):
        await requests.open(0, None, None, for_new_reader=True)
    assert await requests.head() == origin._info("a.tar")  # the HEAD for its checksums
    await read(requests.open(5_000, None, None))  # a later segment
    assert origin.contexts[-2:] == [CONTINUED_REQUEST, CONTINUED_REQUEST]
    assert gate.shed_requests == 2
    await asyncio.gather(*waiting)


async def test_a_get_holds_its_place_at_the_gate_until_its_body_ends(origin: FakeOrigin) -> None:
    """`max_requests = 1`: the second GET waits for the first's body to end, then goes."""
    gate = OriginGate("fake", GateCaps(max_requests=1))
    policy = make_policy(read_timeout_s=5.0)
    requests = OriginRequests(origin, "a.tar", policy, NullObserver(), gate)
    first = await requests.open(0, None, None)
    second = asyncio.create_task(requests.open(0, None, None))
    await until("the second GET waits for a place", lambda: gate.waiting_for_place == 1)
    assert not second.done() and len(origin.opens) == 1
    async for _ in first:
        pass
    await read(asyncio.wait_for(second, 1.0))
    assert len(origin.opens) == 2


async def test_the_caps_bound_requests_at_once_and_a_second() -> None:
    """Twelve fills' GETs through one gate with `max_requests = 3` and 100 a second: never
    more than three bodies open at once, and the twelve sent 10 ms apart at least."""
    origin = FakeOrigin("capped")
    origin.pace = Pace(0.01)
    data = b"y" * 40_000
    for i in range(12):
        origin.put(f"k{i}", data)
    gate = OriginGate("capped", GateCaps(max_requests=3, max_requests_per_second=100))
    policy = make_policy(read_timeout_s=30.0)

    async def read_one(key: str) -> bytes:
        stream = await OriginRequests(origin, key, policy, NullObserver(), gate).open(0, None, None)
        try:
            return b"".join([c async for c in stream])
        finally:
            await stream.aclose()

    loop = asyncio.get_running_loop()
    started = loop.time()
    bodies = await asyncio.gather(*(read_one(f"k{i}") for i in range(12)))
    assert bodies == [data] * 12
    assert origin.pace.most_open_streams == 3  # never more at once, and the cap was reached
    assert loop.time() - started >= 11 / 100 * 0.9  # twelve requests spaced 10 ms apart


async def test_a_get_waits_for_its_place_and_its_turn_within_one_bound(origin: FakeOrigin) -> None:
    """`max_requests = 1` and 1 a second, read timeout 0.7 s: the second GET waits 0.4 s for
    the first's place, then its turn is 0.6 s off. Waited one after the other it would be
    sent 1 s after it asked, past the read timeout (found by the attack pass: a GET could wait
    twice the read timeout); the turn may wait only what is left, so it is shed."""
    gate = OriginGate("fake", GateCaps(max_requests=1, max_requests_per_second=1))
    policy = make_policy(read_timeout_s=0.7)
    first = await OriginRequests(origin, "a.tar", policy, NullObserver(), gate).open(0, None, None)
    second = asyncio.create_task(
        OriginRequests(origin, "a.tar", policy, NullObserver(), gate).open(0, None, None)
    )
    await until("the second waits for the place", lambda: gate.waiting_for_place == 1)
    await asyncio.sleep(0.4)  # the first's body streams for 0.4 s: the wait being measured
    await first.aclose()
    with pytest.raises(OriginShed, match="next turn is 1 s off"):
        await asyncio.wait_for(second, 2.0)
    assert len(origin.opens) == 1
