"""The `/_/` endpoints: purge, prefetch (queue, show, drop), plans, origins and status.

Every one of them needs the admin token when one is configured (`middleware.admit_request`).
A prefetch body is read within the body timeout and at most MAX_BODY_BYTES, and parsed and
expanded off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web

from shardcache.errors import BadRequest, PlansOff, QueueFull, RequestTimeout
from shardcache.middleware import CACHE_KEY, PREFETCH_KEY, STATE_KEY, redacted
from shardcache.plans import Plan, PlanRefused
from shardcache.prefetch import parse_targets

MAX_BODY_BYTES = 4 << 20  # a prefetch list of 100,000 keys; a larger body is a 413


async def delete_object(request: web.Request) -> web.Response:
    await request.app[CACHE_KEY].purge(request.match_info["origin"], request.match_info["key"])
    return web.json_response(
        {"deleted": f"{request.match_info['origin']}/{request.match_info['key']}"}
    )


async def post_prefetch(request: web.Request) -> web.Response:
    queue = request.app[PREFETCH_KEY]
    raw = await _read_body(request)
    origins = set(request.app[CACHE_KEY].origins)
    # Parsing and expanding up to MAX_EXPANSION keys takes longer than the loop may be held.
    targets, warm = await asyncio.to_thread(_parse_prefetch_body, raw, origins)
    submitted = await queue.submit(targets, warm=warm)
    return web.json_response(
        {
            "queued": submitted.queued,
            "cached": submitted.cached,
            "in_flight": submitted.in_flight,
            "batch": submitted.batch,
        },
        status=202,
    )


async def _read_body(request: web.Request) -> bytes:
    """The request body: at most MAX_BODY_BYTES (413 beyond, before reading when announced),
    within the body timeout (408: a client announcing a body and sending nothing)."""
    announced = request.content_length
    if announced is not None and announced > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=announced)
    timeout_s = request.app[STATE_KEY]["client_body_timeout_s"]
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()  # aiohttp answers 413 past client_max_size
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None


def _parse_prefetch_body(raw: bytes, origins: set[str]) -> tuple[list[tuple[str, str]], bool]:
    """The (origin, key) targets of a POST /_/prefetch body, and whether it asks to warm."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        raise BadRequest("the body is not JSON (or is nested too deep)") from None
    targets = parse_targets(body, origins)
    warm = body.get("warm", False)  # a dict: parse_targets said so
    if not isinstance(warm, bool):
        raise BadRequest('"warm" must be true or false')
    return targets, warm


async def post_plan(request: web.Request) -> web.Response:
    """`{"job": ID, "epoch": N, "urls": ["/NAME/KEY", ...]}`: the keys job ID reads next, in
    order (the rest of this epoch, then optionally the next). Replaces the job's last plan."""
    cache = request.app[CACHE_KEY]
    plans = cache.store.plans
    if plans is None:
        raise PlansOff("plans are off (--eviction lru): nothing would use this plan")
    raw = await _read_body(request)

    def post() -> Plan:  # up to MAX_EXPANSION keys: parsed and indexed off the event loop
        job, epoch, targets = _parse_plan_body(raw, set(cache.origins))
        keys = [cache.cache_key(origin, key)[1] for origin, key in targets]
        try:
            return plans.post(job, epoch, keys)
        except PlanRefused as exc:
            raise QueueFull(str(exc)) from None

    plan = await asyncio.to_thread(post)
    return web.json_response({"job": plan.job, "epoch": plan.epoch, "keys": len(plan.keys)})


MAX_JOB_CHARS = 200


def _parse_plan_body(raw: bytes, origins: set[str]) -> tuple[str, int, list[tuple[str, str]]]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON (or is nested too deep)") from None
    if not isinstance(body, dict) or not ({"urls", "keys"} & body.keys()):
        raise BadRequest('expected {"job": ID, "epoch": N, "urls": ["/NAME/KEY", …]}')
    job, epoch = body.pop("job", None), body.pop("epoch", 0)
    if not isinstance(job, str) or not 0 < len(job) <= MAX_JOB_CHARS or not job.isprintable():
        raise BadRequest(f'"job" must be a name of 1 to {MAX_JOB_CHARS} printable characters')
    if type(epoch) is not int or not 0 <= epoch < 2**31:
        raise BadRequest('"epoch" must be a whole number from 0')
    if "warm" in body:
        raise BadRequest("unknown field(s): warm")
    if body.get("urls") == [] and "keys" not in body:
        return job, epoch, []  # nothing more to read: the job's plan ends
    return job, epoch, parse_targets(body, origins)


def _batch_id(request: web.Request) -> int | None:
    """The `?batch=N` of a request, or None when absent; a 404 for one that names no batch."""
    if "batch" not in request.query:
        return None
    batch_id = request.query["batch"]
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if (
        re.fullmatch(r"[0-9]{1,18}", batch_id) is None
        or request.app[PREFETCH_KEY].batch(int(batch_id)) is None
    ):
        raise web.HTTPNotFound(reason=f"no prefetch batch {batch_id[:40]!r}")
    return int(batch_id)


async def get_prefetch(request: web.Request) -> web.Response:
    queue = request.app[PREFETCH_KEY]
    document = queue.status()
    batch_id = _batch_id(request)
    if batch_id is not None:
        document["batch"] = queue.batch_status(batch_id)
    return web.json_response(redacted(document))


async def delete_prefetch(request: web.Request) -> web.Response:
    """Drop what is queued (of one batch, with `?batch=N`) and release the look-ahead budget
    its fetched shards hold: prefetched, unread shards stay cached, unpinned."""
    dropped, released = request.app[PREFETCH_KEY].clear(_batch_id(request))
    return web.json_response({"dropped": dropped, "released_bytes": released})


async def get_status(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response(redacted(await asyncio.to_thread(state["status"])))


async def get_origins(request: web.Request) -> web.Response:
    return web.json_response({"origins": request.app[STATE_KEY]["origin_urls"]})
