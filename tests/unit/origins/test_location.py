"""A bucket's location (`origins.location`): an origin with a bucket answers its own; any
other answers us-east-1's empty constraint; a failover asks its home."""

from __future__ import annotations

import time

from shardcache.cluster.breaker import CircuitBreaker
from shardcache.cluster.tier import Upstream
from shardcache.cluster.upstreams import FailoverOrigin
from shardcache.origins.location import US_EAST_1, Locator, bucket_location
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_timeouts


class Located(FakeOrigin):
    async def bucket_location(self) -> str:
        return "eu-west-1"


async def test_an_origin_without_a_bucket_is_us_east_1_s() -> None:
    origin = FakeOrigin()
    assert not isinstance(origin, Locator)
    assert await bucket_location(origin) == US_EAST_1 == ""


async def test_a_locator_answers_its_own() -> None:
    assert await bucket_location(Located()) == "eu-west-1"


async def test_a_failover_asks_its_home() -> None:
    home, mirror = Located("home"), FakeOrigin("mirror")
    breakers = [CircuitBreaker(o.name, time.monotonic) for o in (home, mirror)]
    chain = [Upstream(mirror, breakers[1], "mirror"), Upstream(home, breakers[0], "home")]
    failover = FailoverOrigin("o", chain, timeouts=make_timeouts())  # the home is the chain's last
    assert await bucket_location(failover) == "eu-west-1"
