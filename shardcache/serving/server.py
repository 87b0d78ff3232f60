"""The application: its routes (drawn in docs/architecture.md), its middlewares in order, the
probes and `/metrics`. Handlers reach the daemon only through the `ServingContext` that
`make_app` installs under `CONTEXT_KEY`."""

from __future__ import annotations

import asyncio

from aiohttp import web

from shardcache.observability.logs import FailureLog
from shardcache.observability.metrics import CONTENT_TYPE
from shardcache.serving.admin import (
    MAX_BODY_BYTES,
    delete_cache,
    delete_object,
    delete_prefetch,
    get_cache,
    get_origins,
    get_prefetch,
    get_status,
    get_verify,
    post_plan,
    post_prefetch,
    post_verify,
)
from shardcache.serving.middleware import (
    admit_request,
    errors_as_json,
    json_error,
    track_connection,
)
from shardcache.serving.objects import get_object, head_object
from shardcache.serving.s3_api import s3_requests
from shardcache.serving.s3_errors import add_request_id
from shardcache.serving.server_state import CONTEXT_KEY, ServingContext
from shardcache.serving.status_page import status_page


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[CONTEXT_KEY].state
    if state.is_shutting_down:
        return json_error(503, "shutting down")
    problem = await asyncio.to_thread(state.check_ready)
    if problem:
        return json_error(503, problem)
    return web.json_response({"status": "ready"})


async def metrics_page(request: web.Request) -> web.Response:
    # Rendering reads the store's usage (SQLite, stat): off the event loop.
    body = await asyncio.to_thread(request.app[CONTEXT_KEY].metrics.render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def not_found(request: web.Request) -> web.Response:
    """Any other `/_/` request: a 405 naming the allowed methods when the path exists, else a
    404 (the catch-all route would otherwise hide aiohttp's own 405)."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource.canonical in (CATCH_ALL, "/{origin}/{key}"):
            continue
        match, methods = await resource.resolve(request)
        if match is None:
            allowed |= methods
    if allowed:
        return json_error(
            405,
            f"{request.method} is not allowed on {request.path}",
            {"Allow": ", ".join(sorted(allowed))},
        )
    return json_error(404, f"no such endpoint: {request.path}")


CATCH_ALL = "/_/{rest}"


async def _close_failures(failures: FailureLog) -> None:
    failures.close()  # the counts of failures not yet summarized, before the log ends


def make_app(context: ServingContext) -> web.Application:
    """Return the aiohttp application; `context` is all its handlers reach of the daemon."""
    app = web.Application(
        # s3_requests runs admit_request itself for an S3 client's request (see `s3_api`).
        middlewares=[track_connection, errors_as_json, s3_requests, admit_request],
        client_max_size=MAX_BODY_BYTES,
    )
    app[CONTEXT_KEY] = context
    app.on_cleanup.append(lambda app: _close_failures(context.failures))
    app.on_response_prepare.append(add_request_id)  # x-amz-request-id, for S3 clients
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_delete("/_/cache/{origin}/{key:.*}", delete_object)
    app.router.add_get("/_/cache", get_cache)
    app.router.add_delete("/_/cache", delete_cache)
    app.router.add_post("/_/prefetch", post_prefetch)
    app.router.add_get("/_/prefetch", get_prefetch)
    app.router.add_delete("/_/prefetch", delete_prefetch)
    app.router.add_post("/_/plan", post_plan)
    app.router.add_post("/_/verify", post_verify)
    app.router.add_get("/_/verify", get_verify)
    app.router.add_get("/_/origins", get_origins)
    app.router.add_get("/_/status", get_status)
    app.router.add_get("/_/", status_page)  # the status page, drawn from /_/status
    app.router.add_route("*", "/_/{rest:.*}", not_found)  # canonically CATCH_ALL
    app.router.add_get("/{origin}/{key:.*}", get_object, allow_head=False)
    app.router.add_head("/{origin}/{key:.*}", head_object)
    return app
