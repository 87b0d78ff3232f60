"""`server_state.PostTurns`: admin posts take turns, a bounded line waits, the rest are refused
before anything is read (issue 23, item 7)."""

from __future__ import annotations

import asyncio

import pytest

from shardcache.errors import QueueFull
from shardcache.serving.server_state import PostTurns


async def test_one_turn_at_a_time_a_bounded_line_and_a_bounded_wait() -> None:
    turns = PostTurns(max_waiting=2)
    inside = 0
    most_inside = 0
    release = asyncio.Event()

    async def post() -> None:
        nonlocal inside, most_inside
        async with turns.turn(timeout_s=30):
            inside += 1
            most_inside = max(most_inside, inside)
            await release.wait()
            inside -= 1

    holders = [asyncio.create_task(post()) for _ in range(3)]  # one in, two waiting
    await asyncio.sleep(0)
    with pytest.raises(QueueFull, match="not read"):
        async with turns.turn(timeout_s=30):
            pass
    release.set()
    await asyncio.gather(*holders)
    assert most_inside == 1

    async with turns.turn(timeout_s=30):
        with pytest.raises(QueueFull, match="not read"):
            async with turns.turn(timeout_s=0.01):  # the one ahead takes longer
                pass
