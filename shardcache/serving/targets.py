"""The targets a `POST /_/prefetch` or `POST /_/plans` body names: (origin, key) pairs.

Request parsing, so the serving side's: the body's JSON shape is the HTTP API, and both admin
routes read it, while the prefetch queue (and the plans) take validated pairs and know nothing
of it. Bounded before anything is expanded: a key count and a character budget, so a hostile
body costs little memory and time. Every problem is a `BadRequest` naming the first thing wrong.
"""

from __future__ import annotations

from shardcache.errors import BadRequest, ShardcacheError
from shardcache.keys import validate_key
from shardcache.patterns import MAX_EXPANSION, count, expand

# Characters the names of one request may add up to, counted before expanding: 100,000 names
# of 4,000 characters each would be 400 MB of strings before the key-length check saw one.
MAX_EXPANDED_CHARS = 16 << 20


def _shown(text: str, limit: int = 100) -> str:
    """`text` as an error message quotes it: a 4,000-character key is not echoed whole."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


def parse_targets(body: object, origins: set[str]) -> list[tuple[str, str]]:
    """Return the (origin, key) list a prefetch (or plans) body names, patterns expanded.

    The body is `{"urls": ["/NAME/KEY", …]}` and/or `{"origin": "NAME", "keys": ["KEY", …]}`.
    Raises BadRequest naming the first thing wrong, so that a bad body queues nothing.
    """
    if not isinstance(body, dict) or not ({"urls", "keys"} & body.keys()):
        raise BadRequest('expected {"urls": ["/NAME/KEY", …]} or {"origin": "NAME", "keys": […]}')
    unknown = body.keys() - {"urls", "origin", "keys", "warm"}
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    targets: list[tuple[str, str]] = []
    listed = sum(len(v) for v in (body.get("urls"), body.get("keys")) if isinstance(v, list))
    if listed > MAX_EXPANSION:  # before any of them is looked at
        raise BadRequest(f"more than {MAX_EXPANSION} keys in one request")

    expanded_chars = 0
    # Each target holds the origin's one name string, not a copy cut from its URL.
    names = {name: name for name in origins}

    def add(name: str, pattern: str, where: str) -> None:
        nonlocal expanded_chars
        origin = names.get(name)
        if origin is None:
            raise BadRequest(f"{where}: no origin named {name!r}")
        try:
            expanded_chars += count(pattern) * len(pattern)  # an upper bound per name
            if expanded_chars > MAX_EXPANDED_CHARS:
                raise BadRequest(
                    f"the names would take more than {MAX_EXPANDED_CHARS >> 20} MiB; "
                    "post fewer or shorter ones"
                )
            for key in expand(pattern):
                targets.append((origin, validate_key(key)))
        except ShardcacheError as exc:
            raise BadRequest(f"{where}: {exc}") from None
        if len(targets) > MAX_EXPANSION:
            raise BadRequest(f"more than {MAX_EXPANSION} keys in one request")

    urls = body.get("urls", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise BadRequest('"urls" must be a list of strings like "/NAME/KEY"')
    for url in urls:
        origin, slash, pattern = url.removeprefix("/").partition("/")
        if not url.startswith("/") or not slash:
            raise BadRequest(f"urls: {_shown(url)} is not a local path like /NAME/KEY")
        add(origin, pattern, f"urls: {_shown(url)}")
    if "keys" in body:
        keys, origin = body["keys"], body.get("origin")
        if not isinstance(origin, str):
            raise BadRequest('"keys" needs "origin": "NAME"')
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise BadRequest('"keys" must be a list of strings')
        for key in keys:
            add(origin, key, f"keys: {_shown(key)}")
    if not targets:
        raise BadRequest("nothing to prefetch")
    return targets
