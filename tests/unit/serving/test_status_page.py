"""The status page as a reader without scripts gets it: the recent failures are in the table,
not "none" (only the tiles and the origins table were rendered on the server)."""

from __future__ import annotations

import re
import time
from typing import Any

from shardcache.serving.status_page import BODY, with_figures


def _document(
    failures: list[dict[str, Any]], prefetch_failures: list[dict[str, Any]]
) -> dict[str, Any]:
    requests = {"hit": 1, "miss": 1, "coalesced": 0, "error": 1}
    return {
        "version": "0.1.0",
        "uptime_s": 12.0,
        "listen": "127.0.0.1:8470",
        "hit_ratio": {"requests": 0.5, "bytes": 0.5},
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
        },
        "prefetch": {"recent_failures": prefetch_failures},
        "origins": {
            "web": {
                "url": "http://origin/",
                "requests": requests,
                "bytes": {"cache": 100, "origin": 100},
                "origin_errors": {"http_503": 1},
                "origin_retries": 0,
                "origin_bytes": 100,
                "loader_stall_s": 0.0,
            }
        },
        "recent_failures": failures,
    }


def test_recent_failures_are_rendered_and_none_is_hidden() -> None:
    failure = {"at": time.time() - 5, "origin": "web", "kind": "http_503", "message": "<b>x</b>"}
    prefetched = {"url": "/web/a.tar", "kind": "not_found", "error": "no such key"}
    page = with_figures(BODY.decode(), _document([failure], [prefetched]))
    body = re.search(r'<tbody id="failures">(.*?)</tbody>', page, re.S)
    assert body, page
    rows = re.findall(r"<tr>(.*?)</tr>", body[1])
    assert len(rows) == 2
    assert re.search(r"<td>\d\.\d\d s ago</td><td>request</td><td>web</td>", rows[0]), rows[0]
    assert "&lt;b&gt;x&lt;/b&gt;" in rows[0] and "<b>" not in rows[0]
    assert "<td>prefetch</td><td>web</td><td>not_found</td>" in rows[1]
    assert 'id="no-failures" class="muted" hidden>' in page


def test_without_failures_the_page_says_none() -> None:
    page = with_figures(BODY.decode(), _document([], []))
    assert '<tbody id="failures"></tbody>' in page
    assert 'id="no-failures" class="muted">none<' in page


def test_an_origins_gate_shows_its_caps_what_waits_and_what_was_shed() -> None:
    """Found by the new-user pass: the page showed the caps only (`0, cap 1/s, 2 at once`),
    not the requests waiting at the gate or turned away by it."""
    document = _document([], [])
    document["origins"]["web"]["gate"] = {
        "max_requests": 2,
        "max_requests_per_second": 0.5,
        "in_use": 2,
        "waiting": 3,
        "waiting_for_place": 1,
        "shed": 7,
        "abandoned": 0,
    }
    page = with_figures(BODY.decode(), document)
    row = re.search(r'<tr data-origin="web">(.*?)</tr>', page, re.S)
    assert row, page
    assert row[1].endswith('<td class="num">0, cap 0.5/s, 2 at once, 4 waiting, 7 shed</td>'), row[
        1
    ]
    del document["origins"]["web"]["gate"]  # an origin with no gate figures: the count alone
    page = with_figures(BODY.decode(), document)
    row = re.search(r'<tr data-origin="web">(.*?)</tr>', page, re.S)
    assert row and row[1].endswith('<td class="num">0</td>'), row
