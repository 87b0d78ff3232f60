"""What every request goes through around its handler, one layer each (every layer costs every
request): `track_connection` stops the guard's clocks; `errors_as_json` turns every error before
the response started into `{"error": "..."}` with its class's status, credentials masked;
`admit_request` refuses an encoded body, a foreign Host, a cross-site change, a missing token."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shardcache.errors import (
    CrossSite,
    OriginError,
    OriginNotFound,
    OriginShed,
    OriginThrottled,
    QueueFull,
    RangeNotSatisfiable,
    RequestTimeout,
    ShardcacheError,
    ShuttingDown,
    TierLoop,
    Unauthorized,
)
from shardcache.keys import ERROR_KIND_HEADER
from shardcache.observability.logs import redact
from shardcache.serving.access import is_cross_site, is_foreign_host
from shardcache.serving.server_state import CONTEXT_KEY

log = logging.getLogger("shardcache.server")
_BODY_HEADERS = {"content-type", "content-length"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The access key id an S3 client's request was validly signed with (`s3_api`): it stands for
# the token where reads need one.
SIGNER_KEY = web.RequestKey("s3_signer", str)


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error. Messages can quote origin URLs: any credentials in them are masked."""
    return web.json_response({"error": redact(message)}, status=status, headers=headers)


def redacted(document: Any) -> Any:
    """`document` with credentials masked in every string (failures quote origin URLs)."""
    if isinstance(document, str):
        return redact(document)
    if isinstance(document, dict):
        return {key: redacted(value) for key, value in document.items()}
    if isinstance(document, list):
        return [redacted(value) for value in document]
    return document


def _retry_after(seconds: float | None) -> dict[str, str]:
    """A `Retry-After` header passing on a hint (an upstream's, a cap's), bounded to an hour."""
    wait_s = min(seconds or 0.0, 3600.0)
    return {"Retry-After": f"{math.ceil(wait_s)}"} if wait_s > 0 else {}


def _origin_error_message(request: web.Request, exc: OriginError) -> str:
    """What a client is told of an origin failure. Behind an admin token, a client without it
    learns the kind, not the origin's host, prefix or root: those are configuration."""
    access = request.app[CONTEXT_KEY].access
    if access.is_enabled and not access.is_authorized(request.headers.get("Authorization")):
        what = request.path if len(request.path) <= 200 else request.path[:200] + "…"
        return f"{what}: {exc.kind.replace('_', ' ')} at the origin (details in the daemon's log)"
    return str(exc)


@web.middleware
async def track_connection(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection guard a request is in progress: its idle and header clocks stop."""
    guard = request.app[CONTEXT_KEY].guard
    if guard is None:
        return await handler(request)
    guard.request_started(request.transport)
    try:
        return await handler(request)
    finally:
        guard.request_finished(request.transport)


@web.middleware
async def admit_request(
    request: web.Request, handler: Handler, path: str | None = None
) -> web.StreamResponse:
    """Refuse, before anything else is done for it, a request with an encoded body (none is
    taken; the daemon runs aiohttp with auto_decompress off, so nothing inflates one meanwhile)
    one a loopback daemon gets under a foreign Host name (DNS rebinding), a change a web page
    of another site sent (`access.is_cross_site`), and one for a protected path without the
    admin token. One middleware: each layer costs every request, and 64 KiB hits are counted
    in requests per second. `path`: the path whose protection applies, when it is not the
    request's own (a virtual-hosted S3 request's `/metrics` is an object, not the probe)."""
    encoding = request.headers.get("Content-Encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        response = json_error(415, f"request bodies may not be encoded ({encoding[:40]!r})")
        response.force_close()
        return response
    headers = request.headers
    access = request.app[CONTEXT_KEY].access
    if access.loopback_only and is_foreign_host(headers.get("Host")):
        request.app[CONTEXT_KEY].metrics.client_refusal("cross_site")
        raise CrossSite(
            "this daemon listens on loopback and answers only to localhost, 127.0.0.1 or "
            "[::1] as Host (another name may be a DNS rebinding)"
        )
    if is_cross_site(
        request.method,
        request.path,
        headers.get("Host"),
        headers.get("Origin"),
        headers.get("Sec-Fetch-Site"),
    ):
        request.app[CONTEXT_KEY].metrics.client_refusal("cross_site")
        raise CrossSite("a change to the daemon sent by a web page of another site is refused")
    if access.is_protected(path or request.path) and SIGNER_KEY not in request:
        basic = access.takes_basic(request.method, request.path)  # the status page
        if not access.is_authorized(request.headers.get("Authorization"), allow_basic=basic):
            request.app[CONTEXT_KEY].metrics.client_refusal("unauthorized")
            raise Unauthorized("this endpoint needs the admin token: Authorization: Bearer TOKEN")
    return await handler(request)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error raised before the response started into `{"error": "..."}`."""
    try:
        return await handler(request)
    except Unauthorized as exc:
        # The status page is for browsers, which ask their user only for Basic credentials
        # (the token as the password; browsers parse a list of challenges unreliably).
        scheme = "Basic" if request.path == "/_/" else "Bearer"
        headers = {"WWW-Authenticate": f'{scheme} realm="shardcache"', ERROR_KIND_HEADER: exc.kind}
        return json_error(exc.status, str(exc), headers)
    except RequestTimeout as exc:
        request.app[CONTEXT_KEY].metrics.client_timed_out("body")
        response = json_error(exc.status, str(exc), {"Connection": "close"})
        response.force_close()  # the rest of the body may never come: do not wait for it
        return response
    except RangeNotSatisfiable as exc:
        # RFC 9110 §15.5.17: a 416 carries Content-Range: bytes */<length>
        return json_error(416, str(exc), {"Content-Range": f"bytes */{exc.size_bytes}"})
    except (ShuttingDown, QueueFull) as exc:
        return json_error(exc.status, str(exc), {"Retry-After": "5", ERROR_KIND_HEADER: exc.kind})
    except OriginThrottled as exc:
        # Passed on as what it is (503 and the hint), so a node daemon reading through this
        # one as a tier slows down instead of asking the next member (`cluster.upstreams`).
        _count_error(request, exc)
        _log_failure(request, exc)
        hint = _retry_after(exc.retry_after_s)
        hint[ERROR_KIND_HEADER] = exc.kind
        return json_error(503, _origin_error_message(request, exc), hint)
    except OriginError as exc:
        _count_error(request, exc)
        _log_failure(request, exc)
        headers = {ERROR_KIND_HEADER: exc.kind}
        if isinstance(exc, OriginShed):
            headers.update(_retry_after(exc.retry_after_s))
        return json_error(exc.status, _origin_error_message(request, exc), headers)
    except ShardcacheError as exc:
        _count_error(request, exc)
        if exc.status >= 500 and not isinstance(exc, TierLoop):  # logged once, where raised
            _log_failure(request, exc)
        return json_error(exc.status, str(exc), {ERROR_KIND_HEADER: exc.kind})
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            # Its own Content-Type and length describe the text body it would have sent.
            kept = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
            return json_error(exc.status, exc.reason, kept)
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error for %s %s", request.method, request.path)
        return json_error(500, "internal error; see the daemon's log")


def _origin_of(request: web.Request) -> str | None:
    """The configured origin a shard request is for; None for other requests."""
    origin = request.match_info.get("origin")
    if (
        origin in request.app[CONTEXT_KEY].cache.origins
        and request.match_info.get("key") is not None
    ):
        return origin
    return None


def _count_error(request: web.Request, exc: ShardcacheError) -> None:
    origin = _origin_of(request)
    if origin is not None:
        request.app[CONTEXT_KEY].metrics.request_counted(origin, "error")


def _log_failure(request: web.Request, exc: ShardcacheError) -> None:
    """A failure the client sees: a WARNING, rate-limited per origin and kind (`FailureLog`).
    A missing object is the origin's answer, not a failure: INFO, beside its access line."""
    if isinstance(exc, OriginNotFound):
        log.info("%s %s: %s", request.method, request.path, exc)
        return
    origin = _origin_of(request) or "-"
    request.app[CONTEXT_KEY].failures.failed(
        origin,
        exc.kind,
        "%s %s failed (%s, origin %s): %s",
        request.method,
        request.path,
        exc.kind,
        origin,
        exc,
    )
