"""The origins and their gates as one unit across reloads (issue 23, item 6): no sockets."""

from __future__ import annotations

import asyncio

from shardcache.fetch.origin_table import OriginTable
from shardcache.observer import NullObserver
from tests.unit.fakes import FakeOrigin


class ClosingOrigin(FakeOrigin):
    closed: asyncio.Event

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.closed = asyncio.Event()

    async def aclose(self) -> None:
        self.closed.set()


async def test_a_reload_builds_a_gate_for_each_new_origin_and_keeps_the_others() -> None:
    """Found: an origin added by SIGHUP got no gate (they were built once, at start-up)."""
    kept, rebuilt = ClosingOrigin("a"), ClosingOrigin("b")
    table = OriginTable({"a": kept, "b": rebuilt}, NullObserver())
    slot_a, slot_b = table.get("a"), table.get("b")
    assert slot_a is not None and slot_b is not None
    added, rebuilt_again = ClosingOrigin("c"), ClosingOrigin("b")
    table.replace({"a": kept, "b": rebuilt_again, "c": added})
    assert table.get("a") is slot_a  # same backend: same gate, throttled or not
    new_b, new_c = table.get("b"), table.get("c")
    assert new_b is not None and new_b.gate is not slot_b.gate
    assert new_c is not None and new_c.origin is added
    await asyncio.wait_for(rebuilt.closed.wait(), 1.0)  # nothing used it: closed at once
    assert not kept.closed.is_set() and not rebuilt_again.closed.is_set()
    await table.aclose()
    assert kept.closed.is_set() and added.closed.is_set()


async def test_a_replaced_origin_closes_when_its_last_user_ends() -> None:
    old, new = ClosingOrigin("a"), ClosingOrigin("a")
    table = OriginTable({"a": old}, NullObserver())
    slot = table.get("a")
    assert slot is not None
    with slot.using():
        table.replace({"a": new})
        assert table.slot_of(old) is slot  # a fill that outlives the reload keeps its gate
        await asyncio.sleep(0)
        assert not old.closed.is_set()  # a fill still reads through it
    await asyncio.wait_for(old.closed.wait(), 1.0)
    assert table.slot_of(old) is None
    await table.aclose()


async def test_a_replaced_origin_still_in_use_is_closed_after_a_bound() -> None:
    old = ClosingOrigin("a")
    table = OriginTable({"a": old}, NullObserver(), retire_wait_s=0.05)
    slot = table.get("a")
    assert slot is not None
    with slot.using():  # a request that never ends
        table.replace({})
        await asyncio.wait_for(old.closed.wait(), 1.0)
    await table.aclose()


async def test_what_is_shown_of_the_origins_is_the_tables_whole_after_a_reload() -> None:
    """The table is the one owner of the set of origins: the URLs shown, which origins have
    upstreams and the lone homes all follow a replace at once (before, the daemon kept four
    copies in step by hand, and a reload updated each)."""
    from shardcache.config import OriginSpec
    from shardcache.fetch.origin_table import ConfiguredOrigin

    tiered = OriginSpec("a", "https://home/x", tier=("http://m0:8470",))
    lone = OriginSpec("b", "https://user:secret@cdn/y")
    a, b = ClosingOrigin("a"), ClosingOrigin("b")
    table = OriginTable(
        {
            "a": ConfiguredOrigin(a, tiered, "https://home/x", "https://home/x"),
            "b": ConfiguredOrigin(b, lone, "https://user:***@cdn/y", "https://cdn/y"),
        },
        NullObserver(),
    )
    assert table.has_upstreams("a") and not table.has_upstreams("b")
    assert not table.has_upstreams("unknown")
    assert table.lone_homes() == {"b": "https://cdn/y"}
    assert table.specs == {"a": tiered, "b": lone}
    gate = table.get("b").gate  # type: ignore[union-attr]
    moved = OriginSpec("b", "https://cdn/z")
    table.replace({"b": ConfiguredOrigin(b, moved, "https://cdn/z", "https://cdn/z")})
    assert table.shown_urls() == {"b": "https://cdn/z"} and len(table) == 1
    assert table.lone_homes() == {"b": "https://cdn/z"} and table.specs == {"b": moved}
    assert table.get("b").gate is gate  # type: ignore[union-attr]  # same backend
    await asyncio.wait_for(a.closed.wait(), 1.0)  # dropped from the table: closed
    await table.aclose()


async def test_a_listing_holds_a_place_under_max_requests_and_a_head_takes_none() -> None:
    """A listing is a GET with a body: under `max_requests = 1` a second one waits for the
    first's place (and is shed when it does not come in time); a HEAD goes meanwhile."""
    from shardcache.config import OriginSpec
    from shardcache.errors import OriginShed
    from shardcache.fetch.origin_table import ConfiguredOrigin

    origin = FakeOrigin("a")
    spec = OriginSpec("a", "https://home/x", max_requests=1)
    table = OriginTable({"a": ConfiguredOrigin(origin, spec)}, NullObserver())
    async with table.one_request(origin, 1.0, is_get=True):
        async with table.one_request(origin, 0.05):
            pass  # a HEAD: no place
        try:
            async with table.one_request(origin, 0.05, is_get=True):
                raise AssertionError("a second listing went while the first held the place")
        except OriginShed as shed:
            assert shed.kind == "busy"
    async with table.one_request(origin, 0.05, is_get=True):
        pass  # the place came back


async def test_a_reload_that_keeps_the_store_keeps_the_gate_under_its_new_caps() -> None:
    """A new backend for the same URL (its headers or caps changed, say) keeps the gate, so
    the replaced backend's open GETs still count against `max_requests`, under the new caps;
    another URL gets a new gate."""
    from shardcache.config import OriginSpec
    from shardcache.fetch.origin_table import ConfiguredOrigin

    capped = OriginSpec("a", "https://home/x", max_requests=2)
    table = OriginTable({"a": ConfiguredOrigin(FakeOrigin("a"), capped)}, NullObserver())
    first = table.get("a")
    assert first is not None
    table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), capped)})
    kept = table.get("a")
    assert kept is not None and kept is not first and kept.gate is first.gate
    table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), OriginSpec("a", "https://home/x"))})
    uncapped = table.get("a")
    assert uncapped is not None and uncapped.gate is first.gate
    assert uncapped.gate.caps.max_requests is None
    table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), OriginSpec("a", "https://other/x"))})
    moved = table.get("a")
    assert moved is not None and moved.gate is not uncapped.gate
    await table.aclose()


async def test_an_origin_put_back_while_its_retired_backend_streams_gets_its_gate_back() -> None:
    """An origin removed (or moved to another URL) by a reload, then put back as it was, while
    the retired backend still holds a place: the gate comes back with it, and the place still
    counts against `max_requests` (found: a new gate, and two bodies under a cap of one)."""
    from shardcache.config import OriginSpec
    from shardcache.fetch.origin_table import ConfiguredOrigin

    capped = OriginSpec("a", "https://home/x", max_requests=1)
    table = OriginTable({"a": ConfiguredOrigin(FakeOrigin("a"), capped)}, NullObserver())
    first = table.get("a")
    assert first is not None
    with first.using():  # a GET of the retired backend, its body streaming
        await first.gate.take_place(5)
        table.replace({})
        table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), capped)})
        back = table.get("a")
        assert back is not None and back.gate is first.gate
        moved = OriginSpec("a", "https://other/x", max_requests=1)
        table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), moved)})
        table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), capped)})
        again = table.get("a")
        assert again is not None and again.gate is first.gate
        assert again.gate.status()["in_use"] == 1
    await table.aclose()


async def test_a_fill_of_a_backend_retired_and_closed_before_it_began_waits_at_its_gate() -> None:
    """A reader looks its key up (an await) with the backend it was given; meanwhile a reload
    lowers the caps (a new backend, the same gate), and the old backend, used by nobody, is
    closed and leaves the table. The fill then built for the old backend must still wait at
    the origin's gate (found in a reload storm: it got none, and its GET went beside a
    max_requests = 1)."""
    from shardcache.config import OriginSpec
    from shardcache.fetch.origin_table import ConfiguredOrigin

    old = ClosingOrigin("a")
    table = OriginTable(
        {"a": ConfiguredOrigin(old, OriginSpec("a", "https://home/x", max_requests=3))},
        NullObserver(),
    )
    first = table.get("a")
    assert first is not None
    lowered = OriginSpec("a", "https://home/x", max_requests=1)
    table.replace({"a": ConfiguredOrigin(FakeOrigin("a"), lowered)})
    await asyncio.wait_for(old.closed.wait(), 1.0)  # nobody used it: closed, out of the table
    for _ in range(3):
        await asyncio.sleep(0)
    assert table.gate_of(old) is first.gate
    assert first.gate.caps.max_requests == 1
    await table.aclose()
