"""The per-origin request limiter (issue 14, throttling), with a fake clock: no sockets."""

from __future__ import annotations

import asyncio

import pytest

from shardcache.limiter import CALM_S, RequestLimiter
from shardcache.origins.http import retry_after_s


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


async def test_unlimited_until_throttled_then_half_the_last_seconds_rate() -> None:
    clock, limits = Clock(), []
    limiter = RequestLimiter("o", limits.append, clock)
    burst = await _send(limiter, 200)  # 200 requests in the same second, none paced
    assert not limiter.is_throttled
    for at in burst[-20:]:  # twenty refusals of requests sent together: one cut
        limiter.throttled(at)
    assert limiter.rate == 100 and limits == [100] and limiter.throttled_answers == 20
    clock.now += 0.5
    (late,) = await _send(limiter, 1)  # sent after the cut, refused too: cut again
    limiter.throttled(late)
    assert limiter.rate == 50


async def test_requests_are_spaced_at_the_rate() -> None:
    limiter = RequestLimiter("o")
    limiter.rate = 20.0  # as if throttled and grown back
    loop = asyncio.get_running_loop()
    began = loop.time()
    await _send(limiter, 6)
    assert loop.time() - began >= 5 / 20 * 0.9


async def test_grows_back_and_lifts_when_calm() -> None:
    clock, limits = Clock(), []
    limiter = RequestLimiter("o", limits.append, clock)
    sent = await _send(limiter, 40)
    for at in sent[-4:]:  # a tenth of them refused
        limiter.throttled(at)
    assert limiter.rate == 20
    for _ in range(20):  # a second's worth of answers at 20/s: about one more a second
        limiter.answered()
    assert limiter.rate is not None and 20.9 <= limiter.rate < 21.5
    clock.now += CALM_S  # nothing sent in the last second: the rate does not bind
    limiter.answered()
    assert limiter.rate is None and limits[-1] == 0


def test_a_log_line_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = RequestLimiter("lake", clock=clock)
    for _ in range(50):
        clock.now += 1
        limiter.throttled(clock.now)
        limiter.throttled(clock.now)
    clock.now += CALM_S
    limiter.answered()
    lines = [r.getMessage() for r in caplog.records if "lake" in r.getMessage()]
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


@pytest.mark.parametrize(("hint", "waited_s"), [(3600.0, 30.0), (2.0, 2.0)])
async def test_a_retry_waits_for_the_hint_at_most_thirty_seconds(
    monkeypatch: pytest.MonkeyPatch, hint: float, waited_s: float
) -> None:
    """A hostile or confused origin's `Retry-After: 3600` must not park a fill for an hour."""
    from shardcache.errors import OriginThrottled
    from shardcache.observer import NullObserver
    from shardcache.segments import OriginRequests, RetryPolicy
    from tests.unit.fakes import FakeOrigin

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("shardcache.segments.asyncio.sleep", sleep)
    requests = OriginRequests(FakeOrigin(), "a.tar", RetryPolicy(base_s=0.25), NullObserver())
    await requests._back_off(1, OriginThrottled("503 SlowDown", hint), 0)
    assert slept == [waited_s]
