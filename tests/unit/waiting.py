"""Waiting in unit tests for what another task or thread does: on its state, with a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(what: str, condition: Callable[[], object], timeout_s: float = 10) -> None:
    """Yield to the loop until `condition` holds; fail naming `what` after `timeout_s`.

    The poll sleeps a millisecond, not zero, so a thread the condition waits on gets the GIL."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.001)
