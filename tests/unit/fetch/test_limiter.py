"""The per-origin request limiter (issue 14, throttling), with a fake clock: no sockets."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shardcache.errors import OriginShed, OriginThrottled
from shardcache.fetch.limiter import BETA, CALM_S, CUBIC_C, RequestLimiter
from shardcache.origins.http import retry_after_s
from tests.unit.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _send(limiter: RequestLimiter, count: int) -> list[float]:
    sent = []
    for _ in range(count):
        async with limiter.permit() as at:
            sent.append(at)
    return sent


async def test_unlimited_until_throttled_then_beta_of_the_last_seconds_rate() -> None:
    clock, limits = Clock(), []
    limiter = RequestLimiter("o", limits.append, clock)
    burst = await _send(limiter, 200)  # 200 requests in the same second, none paced
    assert not limiter.is_throttled
    for at in burst[-20:]:  # twenty refusals of requests sent together: one cut
        limiter.throttled(at)
    assert limiter.rate == pytest.approx(BETA * 200) and limits == [140]
    assert limiter.throttled_answers == 20
    clock.now += 0.5
    grown = limiter.rate
    assert grown is not None and grown > BETA * 200  # growing back meanwhile
    limiter.throttled(clock.now)  # sent after the cut, refused too: cut again
    assert limiter.rate == pytest.approx(BETA * grown)


async def test_requests_are_spaced_at_the_rate() -> None:
    limiter = RequestLimiter("o")
    sent = await _send(limiter, 40)
    for at in sent[-4:]:  # a tenth refused: the rate becomes BETA of 40 a second
        limiter.throttled(at)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await _send(limiter, 6)
    assert loop.time() - began >= 5 / (BETA * 40) * 0.9


async def test_grows_back_along_the_cubic_and_lifts_when_calm() -> None:
    clock, limits = Clock(), []
    limiter = RequestLimiter("o", limits.append, clock)
    sent = await _send(limiter, 40)
    for at in sent[-4:]:  # a tenth of them refused
        limiter.throttled(at)
    assert limiter.rate == pytest.approx(28)
    k = (40 * (1 - BETA) / CUBIC_C) ** (1 / 3)
    clock.now += k / 2  # fast at first…
    assert limiter.rate is not None and 38 < limiter.rate < 40
    clock.now += k / 2  # …flat near the rate the origin refused…
    assert limiter.rate == pytest.approx(40)
    clock.now += 2  # …and faster again past it
    assert limiter.rate is not None and limiter.rate > 40
    clock.now += CALM_S  # nothing sent in the last second: the rate does not bind
    limiter.answered()
    assert limiter.rate is None and limits[0] == 28 and limits[-1] == 0


async def test_waiting_requests_go_as_soon_as_the_limit_lifts() -> None:
    """Found: requests that booked their turn at 1 a second kept it after the origin
    recovered (`permit()` slept what it computed when called): answers left at 1 a second
    for 98 s. Waiting requests re-time when the rate changes."""
    clock = Clock()
    limiter = RequestLimiter("o", clock=clock)
    for at in await _send(limiter, 2):  # both refused: as slow as it gets
        limiter.throttled(at)
    assert limiter.rate is not None and limiter.rate <= 2
    waiting = [asyncio.create_task(_send(limiter, 1)) for _ in range(8)]
    await until("the 8 requests queue up", lambda: limiter.waiting == 8)
    assert not any(task.done() for task in waiting)
    clock.now += CALM_S  # calm, and nothing sent in the last second: lifted
    limiter.answered()
    assert limiter.rate is None
    await asyncio.wait_for(asyncio.gather(*waiting), timeout=1.0)  # not 4-8 s


async def test_a_turn_too_far_off_is_shed_with_a_hint() -> None:
    limiter = RequestLimiter("o")
    for at in await _send(limiter, 2):
        limiter.throttled(at)  # about 1.4 a second
    waiting = [asyncio.create_task(_send_within(limiter, 2.0)) for _ in range(10)]
    results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5.0)
    shed = [r for r in results if isinstance(r, OriginShed)]
    assert 5 <= len(shed) <= 8 and limiter.shed_requests == len(shed)
    assert all(exc.retry_after_s is not None and exc.retry_after_s >= 1 for exc in shed)
    assert shed[0].status == 503 and shed[0].kind == "throttled" and not shed[0].is_retryable
    assert limiter.waiting == 0


async def _send_within(limiter: RequestLimiter, max_wait_s: float) -> float:
    async with limiter.permit(max_wait_s) as at:
        return at


def test_a_log_line_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = RequestLimiter("lake", clock=clock)
    for _ in range(50):
        clock.now += 1
        limiter.throttled(clock.now)
        limiter.throttled(clock.now)
    clock.now += CALM_S
    limiter.answered()
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
    limiter = RequestLimiter("o", clock=clock)
    for _ in range(30):
        sent = await _send(limiter, 100)  # 100 a second…
        for at in sent[:3]:  # …of which 3 refused
            limiter.throttled(at)
        clock.now += 1.1
    assert not limiter.is_throttled and limiter.throttled_answers == 90


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


def test_the_pacer_spaces_turns_evenly_at_any_rate() -> None:
    """The one pacing the limiter and the caps share: a turn 1/rate after the last one,
    booked ahead when requests come faster than the rate, at once when they come slower."""
    from shardcache.fetch.pacer import Pacer

    pacer = Pacer()
    assert [pacer.book(10.0, 4.0) for _ in range(3)] == [10.0, 10.25, 10.5]
    assert pacer.turn(10.0, 4.0) == 10.75 and pacer.turn(20.0, 4.0) == 20.0
    pacer.give_back(10.5)  # the last booked stopped waiting: its turn is free again
    pacer.give_back(10.25)
    assert pacer.turn(10.0, 4.0) == 10.25
    pacer.went(10.0)
    pacer.went(30.0)  # the limiter's way: a request went when its turn came
    assert pacer.next_at(2.0) == 30.5 and pacer.book(30.1, 2.0) == 30.5


def test_the_pacer_keeps_a_long_burst_in_order_through_give_backs() -> None:
    """30,000 turns booked under a cap of 1,000 a second (a burst), every other one given
    back: the rest come in order, 1 ms apart at least, and the next booking follows the last
    one still booked."""
    from shardcache.fetch.pacer import Pacer

    pacer = Pacer()
    turns = [pacer.book(0.0, 1000.0) for _ in range(30_000)]
    assert turns == sorted(turns) and turns[-1] == pytest.approx(29.999)
    for turn in turns[1::2]:
        pacer.give_back(turn)
    kept = turns[0::2]
    for turn in kept[:-1]:
        pacer.went(turn)
    assert pacer.turn(0.0, 1000.0) == pytest.approx(kept[-1] + 0.001)
    pacer.give_back(kept[-1])
    assert pacer.turn(0.0, 1000.0) == pytest.approx(kept[-2] + 0.001)
