"""The `/_/` endpoints: purge, cached entries, prefetch (queue, show, drop), plans, verify,
origins, status. Each needs the admin token when one is configured (`middleware`). A body is
read within the body timeout and MAX_BODY_BYTES, then parsed and acted on off the event loop,
one post at a time (`server_state.PostTurns`); a post that cannot be taken is refused first."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from shardcache.cache.catalog import MAX_PAGE_ENTRIES, Page, list_page, matching_keys
from shardcache.cache.plans import Plan, PlanBook, PlanRefused
from shardcache.cache.scrub import Scrubber
from shardcache.errors import (
    BadRequest,
    CacheError,
    InvalidKey,
    PlansOff,
    QueueFull,
    RequestTimeout,
)
from shardcache.patterns import MAX_EXPANSION, count, literal_chars
from shardcache.prefetch.queue import PrefetchQueue
from shardcache.serving.middleware import redacted
from shardcache.serving.server_state import CONTEXT_KEY
from shardcache.serving.targets import parse_targets

MAX_BODY_BYTES = 4 << 20  # a prefetch list of 100,000 keys; a larger body is a 413


async def delete_object(request: web.Request) -> web.Response:
    """Purge one key: its entry, and its fill in flight (which finishes for its readers and
    is not kept); 404 when there is neither."""
    purged = await request.app[CONTEXT_KEY].cache.purge(
        request.match_info["origin"], request.match_info["key"]
    )
    return web.json_response(
        {
            "deleted": f"{request.match_info['origin']}/{request.match_info['key']}",
            "entry_deleted": bool(purged.deleted),
            "fill_not_kept": bool(purged.not_kept),
        }
    )


def _catalog_query(request: web.Request, pattern_required: bool) -> tuple[str, str, str, int]:
    """The origin, glob, cursor and page size of a `/_/cache` listing or bulk purge (400 for
    a missing origin, unknown fields or a bad page size; `catalog` checks glob and cursor)."""
    query = request.query
    unknown = sorted(set(query) - {"origin", "pattern", "after", "limit"})
    if unknown or any(len(query.getall(name)) > 1 for name in query):
        named = ", ".join(name[:40] for name in unknown[:5]) or "a field given twice"
        raise BadRequest(f"unknown query field(s): {named} (origin, pattern, after, limit)")
    if not query.get("origin"):
        raise BadRequest("name the origin: ?origin=NAME")
    if pattern_required and "pattern" not in query:
        raise BadRequest('name what to purge: ?pattern=GLOB ("*" for everything)')
    limit = query.get("limit", str(MAX_PAGE_ENTRIES))
    if re.fullmatch(r"[0-9]{1,4}", limit) is None or not 1 <= int(limit) <= MAX_PAGE_ENTRIES:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE_ENTRIES}")
    return query["origin"], query.get("pattern", "*"), query.get("after", ""), int(limit)


async def _catalog_page(request: web.Request, pattern_required: bool, with_pins: bool) -> Page:
    """One page of the query's listing: a bounded index scan, off the event loop, taking its
    turn with the admin posts (a scan is a thread busy in Python too: 64 listings at once held
    /healthz up to 0.9 s), so at most one runs and a long line is refused with 429."""
    name, pattern, after, limit = _catalog_query(request, pattern_required)
    context = request.app[CONTEXT_KEY]
    cache = context.cache
    origin = cache.origin(name)  # 404 for an unknown one
    async with context.turns.turn(context.state.client_body_timeout_s):
        return await asyncio.to_thread(
            list_page, cache.store, origin, pattern, after, limit, with_pins
        )


async def get_cache(request: web.Request) -> web.Response:
    """`?origin=NAME[&pattern=GLOB][&after=CURSOR][&limit=N]`: a page of cached entries (key,
    size, stored and last-read times, what each was verified against, what pins it) and the
    cursor of the next page (`next`, null at the end)."""
    page = await _catalog_page(request, pattern_required=False, with_pins=True)
    return web.json_response(
        {
            "origin": request.query["origin"],
            "entries": [entry.as_dict() for entry in page.entries],
            "next": page.next,
            "scanned": page.scanned,
        }
    )


async def delete_cache(request: web.Request) -> web.Response:
    """`?origin=NAME&pattern=GLOB[&after=CURSOR]`: purge one page of the entries the same
    listing shows, as `DELETE /_/cache/NAME/KEY` purges one (`ShardCache.purge_entries`);
    call again with `after=next` until `next` is null."""
    page = await _catalog_page(request, pattern_required=True, with_pins=False)
    cache = request.app[CONTEXT_KEY].cache
    origin = cache.origin(request.query["origin"])
    # Fills in flight are not in the index yet: each page reaches those matching now (a
    # purged one is joined by no one after, so no later page counts it again).
    keys = {entry.cache_key: entry.key for entry in page.entries}
    keys |= matching_keys(origin, request.query["pattern"], cache.flights.keys())
    purged = await cache.purge_entries(origin, list(keys))
    deleted = set(purged.deleted)
    gone = [entry for entry in page.entries if entry.cache_key in deleted]
    return web.json_response(
        {
            "origin": request.query["origin"],
            "deleted": [entry.key for entry in gone],
            "deleted_bytes": sum(entry.size_bytes for entry in gone),
            "fills_not_kept": [keys[url] for url in purged.not_kept],
            "next": page.next,
        }
    )


async def post_prefetch(request: web.Request) -> web.Response:
    queue = request.app[CONTEXT_KEY].prefetch
    _refuse_when_full(queue, None)  # before waiting for a turn
    timeout_s = request.app[CONTEXT_KEY].state.client_body_timeout_s
    async with request.app[CONTEXT_KEY].turns.turn(timeout_s):
        _refuse_when_full(queue, None)  # the posts ahead of it may have filled the queue
        raw = await _read_body(request)
        origins = set(request.app[CONTEXT_KEY].cache.origins)
        # Parsing and expanding up to MAX_EXPANSION keys takes longer than the loop may be held.
        targets, warm = await asyncio.to_thread(_parse_prefetch_body, raw, origins, queue)
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


def _refuse_when_full(queue: PrefetchQueue, listed: int | None) -> None:
    """Refuse a post the prefetch queue cannot take, before its body is read (`listed`
    None: the queue is full) or before its `listed` names are expanded (each is one key or
    more); `PrefetchQueue.submit` checks the exact count."""
    room = queue.room
    if listed is None and room <= 0:
        raise QueueFull(f"the prefetch queue is full ({queue.depth} items): body not parsed")
    if listed is not None and listed > room:
        raise QueueFull(
            f"the prefetch queue has room for {max(room, 0)} items, and the body lists "
            f"{listed} names: not parsed further"
        )


async def _read_body(request: web.Request) -> bytes:
    """The request body: at most MAX_BODY_BYTES (413 beyond, before reading when announced),
    within the body timeout (408: a client announcing a body and sending nothing)."""
    announced = request.content_length
    if announced is not None and announced > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=announced)
    timeout_s = request.app[CONTEXT_KEY].state.client_body_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()  # aiohttp answers 413 past client_max_size
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        raise BadRequest("the body is not JSON (or is nested too deep)") from None


def _listed(body: dict[str, Any]) -> int:
    """How many names a body lists (before expanding: each is at least one key)."""
    return sum(len(v) for v in (body.get("urls"), body.get("keys")) if isinstance(v, list))


def _parse_prefetch_body(
    raw: bytes, origins: set[str], queue: PrefetchQueue
) -> tuple[list[tuple[str, str]], bool]:
    """The (origin, key) targets of a POST /_/prefetch body, and whether it asks to warm.
    (On a worker thread; raises QueueFull, before expanding, for more names than the queue
    has room for.)"""
    body = _json_body(raw)
    if isinstance(body, dict):
        _refuse_when_full(queue, _listed(body))
    targets = parse_targets(body, origins)
    warm = body.get("warm", False)  # a dict: parse_targets said so
    if not isinstance(warm, bool):
        raise BadRequest('"warm" must be true or false')
    return targets, warm


async def post_plan(request: web.Request) -> web.Response:
    """`{"job": ID, "epoch": N, "urls": ["/NAME/KEY", ...]}`: the keys job ID reads next, in
    order (the rest of this epoch, then optionally the next). Replaces the job's last plan."""
    cache = request.app[CONTEXT_KEY].cache
    plans = cache.store.plans
    if plans is None:
        raise PlansOff("plans are off (--eviction lru): nothing would use this plan")
    timeout_s = request.app[CONTEXT_KEY].state.client_body_timeout_s
    async with request.app[CONTEXT_KEY].turns.turn(timeout_s):
        raw = await _read_body(request)

        def post() -> Plan:  # up to MAX_EXPANSION keys: parsed and indexed off the event loop
            try:
                job, epoch, targets = _parse_plan_body(raw, set(cache.origins), plans)
                keys = [cache.cache_key(origin, key)[1] for origin, key in targets]
                return plans.post(job, epoch, keys)
            except PlanRefused as exc:
                raise QueueFull(str(exc)) from None

        plan = await asyncio.to_thread(post)
    return web.json_response({"job": plan.job, "epoch": plan.epoch, "keys": len(plan.keys)})


MAX_JOB_CHARS = 200


def _parse_plan_body(
    raw: bytes, origins: set[str], plans: PlanBook
) -> tuple[str, int, list[tuple[str, str]]]:
    """The job, epoch and targets of a POST /_/plan body. Raises PlanRefused, before
    expanding, when the plans have no room for as many keys as the body lists."""
    body = _json_body(raw)
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
    plans.check_room(job, *_planned_size(body))
    return job, epoch, parse_targets(body, origins)


def _planned_size(body: dict[str, Any]) -> tuple[int, int]:
    """How many keys a plan body's names expand to, and at least how many characters they
    add up to, counted without expanding them (`patterns.count`): one brace pattern may stand
    for 100,000 keys. A name `parse_targets` will refuse counts as one key."""
    keys = chars = 0
    for field, names in (("urls", body.get("urls")), ("keys", body.get("keys"))):
        if not isinstance(names, list) or len(names) > MAX_EXPANSION:
            continue  # parse_targets says what is wrong
        for name in names:
            if not isinstance(name, str):
                continue
            pattern = name.removeprefix("/").partition("/")[2] if field == "urls" else name
            try:
                expands_to = count(pattern)
            except InvalidKey:
                expands_to = 1
            keys += expands_to
            chars += expands_to * literal_chars(pattern)
    return keys, chars


def _batch_id(request: web.Request) -> int | None:
    """The `?batch=N` of a request, or None when absent; a 404 for one that names no batch."""
    if "batch" not in request.query:
        return None
    batch_id = request.query["batch"]
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if (
        re.fullmatch(r"[0-9]{1,18}", batch_id) is None
        or request.app[CONTEXT_KEY].prefetch.batch(int(batch_id)) is None
    ):
        raise web.HTTPNotFound(reason=f"no prefetch batch {batch_id[:40]!r}")
    return int(batch_id)


async def get_prefetch(request: web.Request) -> web.Response:
    queue = request.app[CONTEXT_KEY].prefetch
    document = queue.status()
    batch_id = _batch_id(request)
    if batch_id is not None:
        document["batch"] = queue.batch_status(batch_id)
    return web.json_response(redacted(document))


async def delete_prefetch(request: web.Request) -> web.Response:
    """Drop what is queued (of one batch, with `?batch=N`) and release the look-ahead budget
    its fetched shards hold: prefetched, unread shards stay cached, unpinned."""
    dropped, released = request.app[CONTEXT_KEY].prefetch.clear(_batch_id(request))
    return web.json_response({"dropped": dropped, "released_bytes": released})


def _scrubber(request: web.Request) -> Scrubber:
    scrub = request.app[CONTEXT_KEY].state.scrub
    if not isinstance(scrub, Scrubber):  # an app without a store (tests of other routes)
        raise CacheError("this daemon has no cache to verify")
    return scrub


async def post_verify(request: web.Request) -> web.Response:
    """Check every cached entry now, at full speed, against its kept digest (damaged ones are
    dropped); or join the check under way. The body is empty or `{}`. Answers 202 with the
    pass's tally; `GET /_/verify` shows its progress until `is_finished`."""
    scrub = _scrubber(request)
    timeout_s = request.app[CONTEXT_KEY].state.client_body_timeout_s
    async with request.app[CONTEXT_KEY].turns.turn(timeout_s):
        raw = await _read_body(request)
        if raw.strip():
            body = _json_body(raw)
            if not isinstance(body, dict):
                raise BadRequest("expected an empty body or {}")
            if body:
                raise BadRequest(f"unknown field(s): {', '.join(sorted(map(str, body))[:10])}")
        tally, joined = scrub.verify_now()
    return web.json_response({"joined": joined, "verify": tally.as_dict()}, status=202)


async def get_verify(request: web.Request) -> web.Response:
    """The latest `POST /_/verify` pass (null before the first)."""
    last = _scrubber(request).last_verify
    return web.json_response(redacted({"verify": None if last is None else last.as_dict()}))


async def get_status(request: web.Request) -> web.Response:
    state = request.app[CONTEXT_KEY].state
    document = await asyncio.to_thread(state.status)
    # Failures clients were answered with (the prefetch's own are under "prefetch").
    document["recent_failures"] = request.app[CONTEXT_KEY].failures.recent()
    return web.json_response(redacted(document))


async def get_origins(request: web.Request) -> web.Response:
    return web.json_response({"origins": request.app[CONTEXT_KEY].state.origins.shown_urls()})
