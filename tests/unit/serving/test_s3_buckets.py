"""HeadBucket's origin checks (`serving.s3_buckets`): one listing in flight per origin, its
answer kept a minute when asking again would not change it, a passing failure not kept."""

from __future__ import annotations

import asyncio

import pytest

from shardcache.errors import BucketNotFound, OriginDenied, OriginUnavailable
from shardcache.serving.s3_buckets import TTL_S, BucketChecks


class Asker:
    """A listing that counts its calls and answers when released."""

    def __init__(self, fails: Exception | None = None) -> None:
        self.calls = 0
        self.fails = fails
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        await self.release.wait()
        if self.fails is not None:
            raise self.fails


async def test_concurrent_heads_ask_once_and_the_answer_is_kept_a_minute() -> None:
    now = [0.0]
    checks = BucketChecks(clock=lambda: now[0])
    ask = Asker()
    waiting = [asyncio.create_task(checks.check("lake", ask)) for _ in range(5)]
    await asyncio.sleep(0)
    ask.release.set()
    await asyncio.gather(*waiting)
    assert ask.calls == 1
    now[0] = TTL_S - 1
    await checks.check("lake", ask)
    assert ask.calls == 1
    now[0] = TTL_S + 1
    await checks.check("lake", ask)
    assert ask.calls == 2
    await checks.check("other", ask)
    assert ask.calls == 3


@pytest.mark.parametrize("refusal", [BucketNotFound("gone"), OriginDenied("no")])
async def test_a_missing_or_refused_bucket_is_kept(refusal: Exception) -> None:
    checks = BucketChecks(clock=lambda: 0.0)
    ask = Asker(refusal)
    ask.release.set()
    for _ in range(3):
        with pytest.raises(type(refusal)):
            await checks.check("lake", ask)
    assert ask.calls == 1


async def test_a_failure_that_may_pass_is_asked_again() -> None:
    checks = BucketChecks(clock=lambda: 0.0)
    ask = Asker(OriginUnavailable("503"))
    ask.release.set()
    for _ in range(2):
        with pytest.raises(OriginUnavailable):
            await checks.check("lake", ask)
    assert ask.calls == 2


async def test_a_cancelled_asker_leaves_its_waiters_to_ask_themselves() -> None:
    checks = BucketChecks(clock=lambda: 0.0)
    ask = Asker()
    first = asyncio.create_task(checks.check("lake", ask))
    await asyncio.sleep(0)
    second = asyncio.create_task(checks.check("lake", ask))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    ask.release.set()
    await second
    assert ask.calls == 2 and first.cancelled()


async def test_the_answer_is_returned_and_kept_with_its_value() -> None:
    """GetBucketLocation's: the region the origin answered, to every asker, asked once."""
    locations: BucketChecks[str] = BucketChecks(clock=lambda: 0.0)
    asked: list[str] = []

    async def region() -> str:
        asked.append("eu")
        return "eu-west-1"

    answers = await asyncio.gather(*(locations.check("lake", region) for _ in range(3)))
    assert answers == ["eu-west-1"] * 3 and asked == ["eu"]
    assert await locations.check("lake", region) == "eu-west-1" and asked == ["eu"]
