"""`shardcache stats`' text (`status_text.format_status`): an origin's gate."""

from __future__ import annotations

from typing import Any

import pytest

from shardcache.commands.status_text import format_status


def _document(gate: dict[str, Any] | None) -> dict[str, Any]:
    requests = {"hit": 1, "miss": 1, "coalesced": 0, "error": 3}
    origin: dict[str, Any] = {
        "url": "http://origin/",
        "requests": requests,
        "bytes": {"cache": 100, "origin": 100},
        "origin_errors": {"busy": 3},
        "origin_bytes": 100,
    }
    if gate is not None:
        origin["gate"] = gate
    return {
        "version": "0.1.0",
        "listen": "127.0.0.1:8470",
        "uptime_s": 12.0,
        "hit_ratio": {"requests": 0.2, "bytes": 0.5},
        "requests": requests,
        "bytes": {"cache": 100, "origin": 100},
        "origin_bytes": 100,
        "client_wait_s": 0.0,
        "loader_stall_s": 0.0,
        "cache": {
            "size_bytes": 600_000,
            "entry_bytes": 100,
            "capacity_bytes": 1 << 30,
            "entries": 1,
            "use_ratio": 0.001,
            "evictions": 0,
        },
        "prefetch": {
            "pending": 0,
            "in_flight": 0,
            "fetched": 0,
            "done": 0,
            "failed": 0,
            "unread_bytes": 0,
            "concurrency": 8,
        },
        "origins": {"web": origin},
    }


GATE = {"max_requests": None, "max_requests_per_second": None, "in_use": 0, "waiting": 0}


@pytest.mark.parametrize(
    ("gate", "line"),
    [
        (  # found by the new-user pass: `stats` showed `busy 3` and nothing of the cap
            {
                **GATE,
                "max_requests": 2,
                "max_requests_per_second": 0.5,
                "in_use": 2,
                "waiting": 3,
                "waiting_for_place": 1,
                "shed": 3,
                "abandoned": 1,
            },
            "  gate    cap 0.5/s, 2 at once; 2 in use, 4 waiting, 3 shed, 1 abandoned",
        ),
        (  # no cap, but the origin's throttling set a pace it shed under
            {**GATE, "waiting_for_place": 0, "shed": 5, "abandoned": 0},
            "  gate    no cap; 0 in use, 0 waiting, 5 shed, 0 abandoned",
        ),
    ],
)
def test_an_origins_gate_shows_its_caps_and_counts(gate: dict[str, Any], line: str) -> None:
    assert line in format_status(_document(gate)).splitlines()


@pytest.mark.parametrize(
    "gate", [None, {**GATE, "waiting_for_place": 0, "shed": 0, "abandoned": 0}]
)
def test_an_origin_with_no_cap_that_shed_nothing_has_no_gate_line(
    gate: dict[str, Any] | None,
) -> None:
    text = format_status(_document(gate))
    assert "web" in text and "gate" not in text
