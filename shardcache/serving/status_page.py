"""`GET /_/`: the status page, one self-contained HTML document that polls `/_/status`, sent
with its first figures already in it (escaped). Its Content-Security-Policy lets only its own
hashed script and style run, fetch only from this daemon, and be framed by no one."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import re
import time
from typing import Any

from aiohttp import web

from shardcache.serving.middleware import redacted
from shardcache.serving.server_state import CONTEXT_KEY
from shardcache.serving.status_page_html import page


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _assemble() -> tuple[bytes, str]:
    """The page's bytes, and the CSP that admits exactly its inline script and style."""
    html, script, style = page()
    policy = "; ".join(
        [
            "default-src 'none'",
            f"script-src {_sha256(script)}",
            f"style-src {_sha256(style)}",
            "connect-src 'self'",  # its polls of /_/status, nothing else
            "img-src data:",  # the empty favicon, so the browser does not ask for one
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return html.encode(), policy


BODY, POLICY = _assemble()
HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # for browsers older than CSP's frame-ancestors
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


async def status_page(request: web.Request) -> web.Response:
    """The page, with the figures of `/_/status` now in it (its polls redraw them)."""
    state = request.app[CONTEXT_KEY].state
    document = await asyncio.to_thread(state.status)
    document["recent_failures"] = request.app[CONTEXT_KEY].failures.recent()
    return web.Response(
        body=with_figures(BODY.decode(), redacted(document)).encode(), headers=HEADERS
    )


def with_figures(page_html: str, document: dict[str, Any]) -> str:
    """`page_html` with the status `document`'s figures in its elements, as the script would
    put them (the same texts, and the raw number as `data-value`); every string escaped."""
    for element_id, (shown, value) in _figures(document).items():
        value_attribute = "" if value is None else f' data-value="{html.escape(_js(value))}"'
        found = re.search(rf'id="{re.escape(element_id)}"([^>]*)>[^<]*<', page_html)
        assert found, element_id  # the template and this table name the same ids
        replacement = f'id="{element_id}"{found[1]}{value_attribute}>{html.escape(shown)}<'
        page_html = page_html[: found.start()] + replacement + page_html[found.end() :]
    rows = "".join(_origin_row(name, origin) for name, origin in document["origins"].items())
    page_html = page_html.replace(
        '<tbody id="origins"></tbody>', f'<tbody id="origins">{rows}</tbody>'
    )
    failures = _failure_rows(document, time.time())
    if not failures:
        return page_html
    page_html = page_html.replace(
        '<tbody id="failures"></tbody>', f'<tbody id="failures">{failures}</tbody>'
    )
    return page_html.replace(
        'id="no-failures" class="muted">', 'id="no-failures" class="muted" hidden>'
    )


def _failure_rows(doc: dict[str, Any], now: float) -> str:
    """The recent failures table's rows, as the script's `renderFailures` draws them: without
    them a reader without scripts was told "none" whatever had failed."""
    rows = [
        [_secs(max(0.0, now - f["at"])) + " ago", "request", f["origin"], f["kind"], f["message"]]
        for f in reversed(doc.get("recent_failures") or [])
    ]
    rows += [
        [
            "",
            "prefetch",
            (f["url"].split("/") + ["", ""])[1],
            f["kind"],
            f"{f['url']}: {f['error']}",
        ]
        for f in reversed(doc["prefetch"].get("recent_failures") or [])
    ]
    e = html.escape
    return "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in rows)


def _figures(doc: dict[str, Any]) -> dict[str, tuple[str, float | None]]:
    """Element id -> (text, raw value) for the header and the tiles (the script's `render`)."""
    requests = sum(doc["requests"].values())
    served = doc["bytes"]["cache"] + doc["bytes"]["origin"]
    cache = doc["cache"]
    entry_bytes = cache.get("entry_bytes", cache["size_bytes"])
    return {
        "version": ("v" + str(doc["version"]), None),
        "listen": (str(doc["listen"]), None),
        "uptime": (_secs(doc["uptime_s"]), None),
        "updated": ("as of the page's load", None),
        "hit-ratio-requests": (_pct(doc["hit_ratio"]["requests"]), doc["hit_ratio"]["requests"]),
        "requests-total": (f"{doc['requests']['hit']} hits of {requests} requests", requests),
        "hit-ratio-bytes": (_pct(doc["hit_ratio"]["bytes"]), doc["hit_ratio"]["bytes"]),
        "bytes-served": (_bytes(served), served),
        "bytes-split": (
            f"{_bytes(doc['bytes']['cache'])} from cache, "
            f"{_bytes(doc['bytes']['origin'])} streamed from origins",
            None,
        ),
        "origin-bytes": (_bytes(doc.get("origin_bytes") or 0), doc.get("origin_bytes") or 0),
        "loader-stall": (_secs(doc["loader_stall_s"]), doc["loader_stall_s"]),
        "client-wait": (f"clients waited {_secs(doc['client_wait_s'])} in all", None),
        "cache-fill": (_pct(cache["use_ratio"]), cache["use_ratio"]),
        "cache-size": (
            f"{_bytes(entry_bytes)} in {cache['entries']} "
            f"{'entry' if cache['entries'] == 1 else 'entries'} of "
            f"{_bytes(cache['capacity_bytes'])} (+{_bytes(cache['size_bytes'] - entry_bytes)} "
            "index)",
            None,
        ),
    }


def _origin_row(name: str, origin: dict[str, Any]) -> str:
    """One row of the origins table, as the script's `renderOrigins` draws it (no upstreams)."""
    q = origin["requests"]
    count = q["hit"] + q["miss"] + q["coalesced"] + q["error"]
    errors = ", ".join(f"{k} {v}" for k, v in origin["origin_errors"].items()) or "none"
    throttled = str(origin.get("throttled") or 0)
    if origin.get("request_limit"):
        throttled += f", limit {origin['request_limit']}"
    gate = origin.get("gate") or {}
    if gate.get("max_requests_per_second"):
        throttled += f", cap {gate['max_requests_per_second']:g}/s"
    if gate.get("max_requests"):
        throttled += f", {gate['max_requests']} at once"
    waiting = (gate.get("waiting") or 0) + (gate.get("waiting_for_place") or 0)
    if waiting:
        throttled += f", {waiting} waiting"
    if gate.get("shed"):
        throttled += f", {gate['shed']} shed"
    cells = [
        (f"{q['hit']} / {q['miss']} / {q['coalesced']} / {q['error']}", "num"),
        (_pct(q["hit"] / count) if count else "–", "num"),
        (_bytes(origin["bytes"]["cache"] + origin["bytes"]["origin"]), "num"),
        (_bytes(origin.get("origin_bytes") or 0), "num"),
        (_secs(origin["loader_stall_s"]), "num"),
        (errors, ""),
        (str(origin["origin_retries"]), "num"),
        (throttled, "num"),
    ]
    e = html.escape
    first = f'<td class="name">{e(name)}<div class="muted">{e(str(origin["url"]))}</div></td>'
    rest = "".join(f'<td class="{k}">{e(v)}</td>' if k else f"<td>{e(v)}</td>" for v, k in cells)
    return f'<tr data-origin="{e(name)}">{first}{rest}</tr>'


def _js(value: float) -> str:
    """A number as JavaScript's String() writes it (what the script puts in data-value)."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _pct(ratio: float | None) -> str:
    return "–" if ratio is None else f"{100 * ratio:.1f} %"


def _bytes(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return (f"{n:.{2 if n < 10 else 1}f}" if i else str(round(n))) + " " + units[i]


def _secs(s: float) -> str:
    if s < 120:
        return f"{s:.{2 if s < 10 else 1}f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
