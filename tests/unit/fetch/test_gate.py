"""The per-origin gate (`fetch.gate`): its throttling curve (issue 14), an operator's caps, and
the one queue both pace, with a fake clock where time is only read: no sockets."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shardcache.errors import OriginShed, OriginThrottled
from shardcache.fetch.gate import GateCaps, OriginGate
from shardcache.fetch.throttle import BETA, CALM_S, CUBIC_C
from shardcache.observer import NullObserver
from shardcache.origins.http import retry_after_s
from tests.unit.fakes import FakeOrigin
from tests.unit.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Limits(NullObserver):
    """What the gate reports: each new whole rate, each request that stopped waiting."""

    def __init__(self) -> None:
        self.limits: list[int] = []
        self.abandoned = 0

    def origin_request_limit(self, origin: str, limit: int) -> None:
        self.limits.append(limit)

    def origin_wait_abandoned(self, origin: str) -> None:
        self.abandoned += 1


def uncapped_gate(
    origin: str, limits: list[int] | None = None, clock: Clock | None = None
) -> OriginGate:
    """A gate with no caps: paced by the origin's throttling alone."""
    observer = Limits()
    if limits is not None:
        observer.limits = limits
    return OriginGate(origin, observer=observer, **({"clock": clock} if clock else {}))


async def _send(gate: OriginGate, count: int) -> list[float]:
    return [await gate.turn() for _ in range(count)]


async def test_unlimited_until_throttled_then_beta_of_the_last_seconds_rate() -> None:
    clock, limits = Clock(), []
    gate = uncapped_gate("o", limits, clock)
    burst = await _send(gate, 200)  # 200 requests in the same second, none paced
    assert not gate.throttling.is_throttled
    for at in burst[-20:]:  # twenty refusals of requests sent together: one cut
        gate.throttled(at)
    assert gate.rate == pytest.approx(BETA * 200) and limits == [140]
    assert gate.throttling.throttled_answers == 20
    clock.now += 0.5
    grown = gate.rate
    assert grown is not None and grown > BETA * 200  # growing back meanwhile
    gate.throttled(clock.now)  # sent after the cut, refused too: cut again
    assert gate.rate == pytest.approx(BETA * grown)


async def test_requests_are_spaced_at_the_rate() -> None:
    gate = uncapped_gate("o")
    sent = await _send(gate, 40)
    for at in sent[-4:]:  # a tenth refused: the rate becomes BETA of 40 a second
        gate.throttled(at)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await _send(gate, 6)
    assert loop.time() - began >= 5 / (BETA * 40) * 0.9


async def test_grows_back_along_the_cubic_and_lifts_when_calm() -> None:
    clock, limits = Clock(), []
    gate = uncapped_gate("o", limits, clock)
    sent = await _send(gate, 40)
    for at in sent[-4:]:  # a tenth of them refused
        gate.throttled(at)
    assert gate.rate == pytest.approx(28)
    k = (40 * (1 - BETA) / CUBIC_C) ** (1 / 3)
    clock.now += k / 2  # fast at first…
    assert gate.rate is not None and 38 < gate.rate < 40
    clock.now += k / 2  # …flat near the rate the origin refused…
    assert gate.rate == pytest.approx(40)
    clock.now += 2  # …and faster again past it
    assert gate.rate is not None and gate.rate > 40
    clock.now += CALM_S  # nothing sent in the last second: the rate does not bind
    gate.answered()
    assert gate.rate is None and limits[0] == 28 and limits[-1] == 0


async def test_waiting_requests_go_as_soon_as_the_limit_lifts() -> None:
    """Found: requests that booked their turn at 1 a second kept it after the origin
    recovered (`permit()` slept what it computed when called): answers left at 1 a second
    for 98 s. Waiting requests re-time when the rate changes."""
    clock = Clock()
    gate = uncapped_gate("o", clock=clock)
    for at in await _send(gate, 2):  # both refused: as slow as it gets
        gate.throttled(at)
    assert gate.rate is not None and gate.rate <= 2
    waiting = [asyncio.create_task(_send(gate, 1)) for _ in range(8)]
    await until("the 8 requests queue up", lambda: gate.waiting == 8)
    assert not any(task.done() for task in waiting)
    clock.now += CALM_S  # calm, and nothing sent in the last second: lifted
    gate.answered()
    assert gate.rate is None
    await asyncio.wait_for(asyncio.gather(*waiting), timeout=1.0)  # not 4-8 s


async def test_a_turn_too_far_off_is_shed_with_a_hint() -> None:
    gate = uncapped_gate("o")
    for at in await _send(gate, 2):
        gate.throttled(at)  # about 1.4 a second
    waiting = [asyncio.create_task(_send_within(gate, 2.0)) for _ in range(10)]
    results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5.0)
    shed = [r for r in results if isinstance(r, OriginShed)]
    assert 5 <= len(shed) <= 8 and gate.shed_requests == len(shed)
    assert all(exc.retry_after_s is not None and exc.retry_after_s >= 1 for exc in shed)
    assert shed[0].status == 503 and shed[0].kind == "throttled" and not shed[0].is_retryable
    assert gate.waiting == 0


async def _send_within(gate: OriginGate, max_wait_s: float) -> float:
    return await gate.turn(max_wait_s)


def test_a_log_line_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    gate = uncapped_gate("lake", clock=clock)
    for _ in range(50):
        clock.now += 1
        gate.throttled(clock.now)
        gate.throttled(clock.now)
    clock.now += CALM_S
    gate.answered()
    lines = [
        r.getMessage()
        for r in caplog.records
        if "lake" in r.getMessage() and r.levelno >= logging.WARNING
    ]
    assert len(lines) == 2
    assert "throttling" in lines[0] and "no longer" in lines[1]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("3", 3.0),
        (" 120 ", 120.0),
        (None, None),
        ("soon", None),
        ("-1", None),
        ("9" * 400, None),  # a hostile hint: float() of it is inf
        ("\u00b2", None),  # a digit to str.isdigit, not to float()
        ("Mon, 99 Foo 99999 99:99:99 GMT", None),
    ],
)
def test_retry_after(header: str | None, expected: float | None) -> None:
    assert retry_after_s(header) == expected


def test_retry_after_as_a_date_in_the_past_is_now() -> None:
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


async def test_a_stray_refusal_is_not_a_limit() -> None:
    """Found by the fault soak: 3% of answers were random 503s, each cut the rate, and the
    soak's two minutes took nine; random refusals do not go away by slowing down."""
    clock = Clock()
    gate = uncapped_gate("o", clock=clock)
    for _ in range(30):
        sent = await _send(gate, 100)  # 100 a second…
        for at in sent[:3]:  # …of which 3 refused
            gate.throttled(at)
        clock.now += 1.1
    assert not gate.throttling.is_throttled and gate.throttling.throttled_answers == 90


@pytest.mark.parametrize(("hint", "waited_s"), [(3600.0, None), (31.0, None), (2.0, 2.0)])
def test_a_retry_waits_for_a_hint_shorter_than_the_read_timeout(
    hint: float, waited_s: float | None
) -> None:
    """A hostile or confused origin's `Retry-After: 3600` must not park a fill for an hour;
    found: `Retry-After: 30` or more held a client 4 × 30 s before its 503. A hint longer
    than the read timeout is passed on to the client at once."""
    from tests.unit.policies import make_policy

    policy = make_policy(base_s=0.25, read_timeout_s=30.0)
    refusal = OriginThrottled("503 SlowDown", hint)
    if waited_s is None:
        with pytest.raises(OriginThrottled):
            policy.wait_before_retry(1, refusal, 0)
        # A fill a client already reads from waits the hint out (30 s a retry at most).
        assert policy.wait_before_retry(1, refusal, 0, may_shed=False) == min(hint, 30.0)
    else:
        assert policy.wait_before_retry(1, refusal, 0) == waited_s
        with pytest.raises(OriginThrottled):  # 30 s of the origin's hints in all, at most
            policy.wait_before_retry(2, refusal, throttled_s=29.0)


def test_a_retry_after_other_failures_backs_off_exponentially_with_jitter() -> None:
    from shardcache.errors import OriginUnavailable
    from tests.unit.policies import make_policy

    policy = make_policy(base_s=0.25, cap_s=1.0)
    dropped = OriginUnavailable("connection reset")
    waits = [policy.wait_before_retry(n, dropped, jitter=0.5) for n in (1, 2, 3, 4)]
    assert waits == [0.125, 0.25, 0.5, 0.5]  # doubling, capped, then the jitter
    assert policy.wait_before_retry(1, dropped, throttled_s=1e9) == 0.25  # not throttling


# An operator's caps (`max_requests`, `max_requests_per_second`), paced by the same queue.


async def test_a_rate_cap_spaces_requests_evenly() -> None:
    gate = OriginGate("o", GateCaps(max_requests_per_second=20))
    sent = await _send(gate, 5)
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= 0.05 * 0.9, gaps  # 1/20 s apart, the first at once
    assert gate.rate == 20


async def test_a_turn_past_the_wait_bound_is_shed_at_once_with_its_distance() -> None:
    """All at the same instant under a cap of 1 a second and a 2.5 s bound: turns at 0, 1
    and 2 s; the fourth would wait 3 s, and is told so at once (it is not queued)."""
    clock, observer = Clock(), Limits()
    gate = OriginGate("o", GateCaps(max_requests_per_second=1), observer, clock)
    await gate.turn(2.5)  # goes at once
    waiting = [asyncio.create_task(gate.turn(2.5)) for _ in range(2)]
    await until("both queue up", lambda: gate.waiting == 2)
    with pytest.raises(
        OriginShed, match="max_requests_per_second = 1, the next turn is 3 s off"
    ) as shed:
        await gate.turn(2.5)
    assert (shed.value.retry_after_s, shed.value.kind, shed.value.status) == (3.0, "busy", 503)
    assert gate.shed_requests == 1 and gate.waiting == 2  # the shed one took no turn
    for task in waiting:  # their fills were stopped: they give their turns back
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert gate.waiting == 0 and gate.abandoned_waits == observer.abandoned == 2


@pytest.mark.parametrize("steps_between", range(7))
async def test_a_request_that_stops_waiting_as_the_one_ahead_leaves_takes_no_turn(
    steps_between: int,
) -> None:
    """Readers that leave at once stop their fills within a step or two of the loop: the
    first waiting request leaves and wakes the next (its turn to pace now), which is
    cancelled while it wakes. Found (CI, a loaded 2-core machine): that cancellation was
    swallowed by `asyncio.wait_for`, which on Python 3.11 returns its awaitable's result when
    that is done as it is cancelled; the request took its turn and was sent for nobody."""
    observer = Limits()
    gate = OriginGate("o", GateCaps(max_requests_per_second=1), observer)
    await gate.turn(10)  # goes at once; the next two would wait 1 and 2 s
    first, second = (asyncio.create_task(gate.turn(10)) for _ in range(2))
    await until("both queue up", lambda: gate.waiting == 2)
    first.cancel()
    for _ in range(steps_between):
        await asyncio.sleep(0)
    second.cancel()
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert gate.waiting == 0 and gate.abandoned_waits == observer.abandoned == 2


async def test_a_request_continuing_an_answer_waits_its_turn_unshed_ahead_of_new_ones() -> None:
    """Shedding it would cut off a 200 a client is reading (found: curl exit 18)."""
    gate = OriginGate("o", GateCaps(max_requests_per_second=2))
    await gate.turn(2.5)
    new = [asyncio.create_task(gate.turn(2.5)) for _ in range(2)]
    await until("the new ones queue up", lambda: gate.waiting == 2)
    urgent = asyncio.create_task(gate.turn(0.0, is_urgent=True))  # bound 0: still waits
    await asyncio.wait_for(urgent, 2.0)  # the next turn, 0.5 s on, is the continuing one's
    assert not any(task.done() for task in new)
    for task in new:
        task.cancel()
    await asyncio.gather(*new, return_exceptions=True)


async def test_a_get_holds_its_place_until_its_body_ends() -> None:
    origin = FakeOrigin()
    origin.put("a.tar", b"x" * 10_000)
    gate = OriginGate("o", GateCaps(max_requests=1))
    await gate.take_place(0.2)
    first = gate.holding(await origin.open("a.tar"))
    with pytest.raises(
        OriginShed, match="all 1 of its max_requests stayed in use for 0.2 s"
    ) as shed:
        await gate.take_place(0.2)
    assert shed.value.kind == "busy" and shed.value.retry_after_s == 1.0
    assert b"".join([chunk async for chunk in first]) == b"x" * 10_000  # read to its end
    await asyncio.wait_for(gate.take_place(5), 1)  # the place came back
    second = gate.holding(await origin.open("a.tar"))
    await second.aclose()
    await second.aclose()  # closed twice: given back once
    await asyncio.wait_for(gate.take_place(5), 1)
    urgent = asyncio.create_task(gate.take_place(0.0, is_urgent=True))  # never shed
    await until("it waits for a place", lambda: gate.waiting_for_place == 1)
    assert not urgent.done()
    gate.give_place_back()
    await asyncio.wait_for(urgent, 1)
    uncapped = OriginGate("o")
    await uncapped.take_place(0.0)  # no such cap: taken at once, counted all the same
    assert uncapped.status()["in_use"] == 1
    assert gate.status() == {
        "max_requests": 1,
        "max_requests_per_second": None,
        "in_use": 1,  # the urgent one's
        "waiting": 0,
        "waiting_for_place": 0,
        "shed": 1,
        "abandoned": 0,
    }


async def test_a_place_shed_while_the_rate_cap_binds_says_so() -> None:
    """Both caps: GETs hold their places while they wait for their turns, so when no place
    comes it is the rate cap that binds; the message must not send the operator to raise
    `max_requests` (found by the new-user pass)."""
    clock = Clock()
    gate = OriginGate("o", GateCaps(max_requests=1, max_requests_per_second=1), clock=clock)
    await gate.turn()
    await gate.take_place(5)
    held = asyncio.create_task(gate.turn(30.0))  # the place's holder, waiting for its turn
    await until("it waits for its turn", lambda: gate.waiting == 1)
    with pytest.raises(
        OriginShed,
        match="1 requests wait for their turn under its max_requests_per_second = 1, which binds",
    ):
        await gate.take_place(0.05)
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_a_request_that_stops_waiting_for_a_place_is_counted_and_takes_none() -> None:
    observer = Limits()
    gate = OriginGate("o", GateCaps(max_requests=1), observer)
    await gate.take_place(5)
    leaver = asyncio.create_task(gate.take_place(5))
    await until("it waits for a place", lambda: gate.waiting_for_place == 1)
    leaver.cancel()
    await asyncio.gather(leaver, return_exceptions=True)
    assert gate.abandoned_waits == observer.abandoned == 1 and gate.waiting_for_place == 0
    gate.give_place_back()
    await asyncio.wait_for(gate.take_place(5), 1)  # the leaver holds nothing


async def test_the_lower_of_the_cap_and_the_throttling_paces_and_names_the_shed() -> None:
    clock = Clock()
    gate = OriginGate("lake", GateCaps(max_requests_per_second=100), clock=clock)
    sent = []
    for _ in range(2):
        sent.append(await gate.turn())
        clock.now += 0.01  # at the cap's pace
    for at in sent:
        gate.throttled(at)  # both refused: throttled to a rate or two a second
    rate = gate.rate
    assert rate is not None and rate < 2 and gate.throttling.is_throttled
    waiting = [asyncio.create_task(gate.turn(3.0)) for _ in range(2)]
    await until("two queue up", lambda: gate.waiting == 2)
    with pytest.raises(OriginShed, match="lake is throttling us") as shed:
        await gate.turn(1.0)
    assert shed.value.kind == "throttled"  # passed on as such: a tier below slows down too
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    clock.now += CALM_S
    gate.answered()  # calm: the throttling lifts, the cap stays
    assert gate.rate == 100


async def test_a_request_with_no_wait_left_behind_others_is_shed_even_when_unlimited() -> None:
    """Its retry loop spent the whole read timeout on throttling (`max_wait_s` 0), the limit
    has lifted, and others are still ahead of it: it is shed with a 503, never a 500."""
    clock = Clock()
    gate = OriginGate("o", clock=clock)
    for at in await _send(gate, 2):
        gate.throttled(at)
    ahead = asyncio.create_task(gate.turn(30.0))
    await until("one waits", lambda: gate.waiting == 1)
    clock.now += CALM_S
    gate.answered()  # lifted: the one ahead goes on its next step
    assert gate.rate is None
    with pytest.raises(OriginShed, match="the requests ahead did not go") as shed:
        await gate.turn(0.0)
    assert shed.value.kind == "busy" and shed.value.status == 503
    await asyncio.wait_for(ahead, 1.0)


async def test_a_request_continuing_an_answer_takes_the_next_place_before_new_ones() -> None:
    """Found: the places were a plain FIFO semaphore, so a segment of an answer a client was
    reading waited behind every new reader that came first (their whole bodies)."""
    gate = OriginGate("o", GateCaps(max_requests=1))
    await gate.take_place(5)
    got: list[str] = []

    async def take(name: str, is_urgent: bool) -> None:
        await gate.take_place(5, is_urgent=is_urgent)
        got.append(name)

    waiters = [asyncio.create_task(take(f"new{n}", False)) for n in range(2)]
    await until("the new ones wait", lambda: gate.waiting_for_place == 2)
    waiters += [asyncio.create_task(take(f"rest{n}", True)) for n in range(2)]
    await until("all four wait", lambda: gate.waiting_for_place == 4)
    for n in range(4):
        gate.give_place_back()
        await until(f"place {n + 1} taken", lambda n=n: len(got) == n + 1)
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert got == ["rest0", "rest1", "new0", "new1"]


async def test_a_place_handed_to_a_request_as_it_stops_waiting_goes_on_to_the_next() -> None:
    gate = OriginGate("o", GateCaps(max_requests=1))
    await gate.take_place(5)
    leaver = asyncio.create_task(gate.take_place(5))
    stayer = asyncio.create_task(gate.take_place(5))
    await until("both wait", lambda: gate.waiting_for_place == 2)
    gate.give_place_back()  # handed to the leaver…
    leaver.cancel()  # …which stops waiting before it runs again
    await asyncio.gather(leaver, return_exceptions=True)
    await asyncio.wait_for(stayer, 1)
    gate.give_place_back()
    await asyncio.wait_for(gate.take_place(0.1), 1)  # one place, not two or none
    with pytest.raises(OriginShed):
        await gate.take_place(0.05)


def test_the_curve_keeps_only_the_last_seconds_sends_while_unlimited() -> None:
    """Found in review: every request's send time was kept for ever while the origin never
    throttled (nothing trimmed them then): one float a request, without bound."""
    from shardcache.fetch.throttle import ThrottleCurve

    clock = Clock()
    curve = ThrottleCurve("o", clock=clock)
    for _ in range(10_000):
        clock.now += 0.01  # 100 requests a second for 100 s
        curve.sent(clock.now)
        curve.answered()
    assert not curve.is_throttled
    assert len(curve._sent) <= 101  # the last second's, not 10,000


async def test_a_lowered_max_requests_counts_the_places_held_under_the_old_one() -> None:
    """A reload lowers `max_requests` from 2 to 1 while two GETs hold places: a new GET waits
    until both gave theirs back (found: new caps made a new gate, and three bodies streamed
    at once)."""
    gate = OriginGate("o", GateCaps(max_requests=2))
    await gate.take_place(5)
    await gate.take_place(5)
    gate.recap(GateCaps(max_requests=1))
    newcomer = asyncio.create_task(gate.take_place(5))
    await until("the newcomer waits", lambda: gate.waiting_for_place == 1)
    gate.give_place_back()  # one of the two: still one in use, the new cap's whole
    for _ in range(5):
        await asyncio.sleep(0)
    assert not newcomer.done() and gate.status()["in_use"] == 1
    gate.give_place_back()
    await asyncio.wait_for(newcomer, 1)
    assert gate.status()["in_use"] == 1


async def test_a_raised_or_lifted_max_requests_hands_places_to_those_waiting() -> None:
    gate = OriginGate("o", GateCaps(max_requests=1))
    await gate.take_place(5)
    waiting = [asyncio.create_task(gate.take_place(5)) for _ in range(3)]
    await until("three wait", lambda: gate.waiting_for_place == 3)
    gate.recap(GateCaps(max_requests=2))
    await until("one more goes", lambda: sum(t.done() for t in waiting) == 1)
    assert gate.waiting_for_place == 2 and gate.status()["in_use"] == 2
    gate.recap(GateCaps())  # lifted: the rest go, and each gives its place back as before
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert gate.waiting_for_place == 0
    for _ in range(4):
        gate.give_place_back()
    assert gate.status()["in_use"] == 0
    await gate.take_place(5)  # no cap: taken at once, counted all the same
    assert gate.status()["in_use"] == 1


async def test_a_lifted_rate_cap_lets_the_requests_waiting_under_it_go() -> None:
    """Found: a reload that lifted `max_requests_per_second` left the requests already
    waiting at the old pace (a new gate for the new caps; the old one kept them)."""
    clock = Clock()
    gate = OriginGate("o", GateCaps(max_requests_per_second=0.1), clock=clock)
    await gate.turn(60)  # the next turns are 10 and 20 s off on the fake clock
    waiting = [asyncio.create_task(gate.turn(60)) for _ in range(2)]
    await until("both wait", lambda: gate.waiting == 2)
    gate.recap(GateCaps())
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert gate.rate is None and gate.waiting == 0


async def test_a_cap_set_by_a_reload_counts_the_gets_sent_without_one() -> None:
    """No `max_requests`, two GETs holding bodies; a reload sets `max_requests = 1`: a new GET
    waits until both gave theirs back (found: GETs sent with no cap were not counted, and the
    new cap let a third body start beside the two)."""
    gate = OriginGate("o")
    await gate.take_place(5)
    await gate.take_place(5)
    gate.recap(GateCaps(max_requests=1))
    newcomer = asyncio.create_task(gate.take_place(5))
    await until("the newcomer waits", lambda: gate.waiting_for_place == 1)
    gate.give_place_back()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not newcomer.done() and gate.status()["in_use"] == 1
    gate.give_place_back()
    await asyncio.wait_for(newcomer, 1)
    assert gate.status()["in_use"] == 1


async def test_a_get_holding_a_place_unsent_when_the_cap_is_lowered_waits_for_one_again() -> None:
    """`max_requests = 3` under `max_requests_per_second = 0.1`: one GET sent, two more hold
    places while they wait for their turns. A reload lowers the cap to 1 and lifts the rate:
    the two, not sent yet, must not go beside the one streaming; each waits for a place under
    the new cap (found in a reload storm: three bodies began at once a second after the cap
    was lowered to 1, GETs handed places under the old cap, then sent when the rate lifted)."""
    clock = Clock()
    gate = OriginGate("o", GateCaps(max_requests=3, max_requests_per_second=0.1), clock=clock)
    await gate.enter(60, takes_place=True)  # sent: its body streams
    waiting = [asyncio.create_task(gate.enter(60, takes_place=True)) for _ in range(2)]
    await until("both wait for their turns", lambda: gate.waiting == 2)
    gate.recap(GateCaps(max_requests=1))
    await until("both wait for a place again", lambda: gate.waiting_for_place == 2)
    assert not any(task.done() for task in waiting) and gate.status()["in_use"] == 1
    gate.give_place_back()  # the body streaming ends
    await until("one goes", lambda: sum(task.done() for task in waiting) == 1)
    assert gate.waiting_for_place == 1 and gate.status()["in_use"] == 1
    gate.give_place_back()
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert gate.status()["in_use"] == 1
