"""`CircuitBreaker` once an upstream's bytes failed verification: only verified bytes close it,
so a liar that answers every header and HEAD is backed off as a dead upstream is."""

from __future__ import annotations

from shardcache.cluster.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bad_bytes_open_it_and_only_verified_bytes_close_it() -> None:
    clock = Clock()
    breaker = CircuitBreaker("mirror", clock, base_s=1, cap_s=8)
    sent = clock.now
    assert breaker.failed("md5 does not match", sent, is_integrity=True) is BreakerState.CLOSED
    assert breaker.is_open and breaker.backoff_s == 1
    clock.now += 1
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.sending(carries_bytes=False)  # a HEAD: it proves nothing of the bytes
    assert not breaker.is_open  # so it was no probe: a GET may still be the probe
    assert breaker.succeeded(clock.now) is None  # its answer closes nothing
    probe_sent = clock.now
    breaker.sending()  # the GET: the probe
    assert breaker.is_open  # the others skip it while the probe is under way
    assert breaker.succeeded(probe_sent) is None  # its headers came: not enough
    assert breaker.state is BreakerState.HALF_OPEN
    clock.now += 0.1
    breaker.failed("md5 does not match", probe_sent, is_integrity=True)  # its bytes lied again
    assert breaker.backoff_s == 2  # doubled, as a probe that fails to connect doubles it
    clock.now += 2
    probe_sent = clock.now
    breaker.sending()
    assert breaker.succeeded(probe_sent, proves_bytes=True) is BreakerState.HALF_OPEN
    assert breaker.state is BreakerState.CLOSED
    health = breaker.health()
    assert (health.failures_total, health.integrity_failures_total) == (2, 2)
    # Back to normal: an answer closes it again after an ordinary failure.
    breaker.failed("503")
    clock.now += 1
    assert breaker.succeeded(clock.now) is BreakerState.HALF_OPEN
    assert breaker.health().integrity_failures_total == 2


def test_verified_bytes_sent_before_the_failure_prove_nothing_after_it() -> None:
    clock = Clock()
    breaker = CircuitBreaker("mirror", clock)
    earlier = clock.now
    clock.now += 0.5
    breaker.failed("md5 does not match", clock.now, is_integrity=True)
    assert breaker.succeeded(earlier, proves_bytes=True) is None
    assert breaker.is_open
