"""`GET /_/`: the status page, one HTML document that polls `/_/status` and draws it.

Not every cluster has Grafana; a browser pointed at the daemon should show what it does. The
page is served whole (inline CSS, JS and SVG: nothing from another host, works offline) under a
Content-Security-Policy that lets only its own script and style run (by hash), fetch only from
this daemon and be framed by no one; its script inserts every string of the document as text,
never as HTML (origin names, keys and error messages come from clients and origins). Access is
the other `/_/` routes' (`access`, `middleware.admit_request`): with an admin token the browser
asks for it as a Basic password.
"""

from __future__ import annotations

import base64
import hashlib

from aiohttp import web

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
    """The page (the same bytes every time: its data comes from its polls)."""
    return web.Response(body=BODY, headers=HEADERS)
