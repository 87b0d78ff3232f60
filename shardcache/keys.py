"""Origin names and object keys: what is allowed and what the cache key is (pure).

The cache key is the full origin URL of the object, so renaming an origin or pointing a name at
another bucket never serves another object's bytes.
"""

from __future__ import annotations

import re

from shardcache.errors import InvalidKey

ORIGIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RESERVED_NAMES = frozenset({"metrics", "healthz", "readyz", "_"})
MAX_KEY_BYTES = 1024


def validate_origin_name(name: str) -> str:
    """Return `name` if it may name an origin; raise InvalidKey saying why not."""
    if not ORIGIN_NAME.match(name):
        raise InvalidKey(f"origin name {name!r} must match [A-Za-z0-9][A-Za-z0-9._-]*")
    if name in RESERVED_NAMES:
        raise InvalidKey(f"origin name {name!r} is reserved ({', '.join(sorted(RESERVED_NAMES))})")
    return name


def validate_key(key: str) -> str:
    """Return `key` if it is a safe object key; raise InvalidKey naming the problem.

    Rejected: empty keys, text that is not valid Unicode, keys over 1024 UTF-8 bytes, NUL,
    backslash, and empty, `.` or `..` segments (which would let a key escape a file origin's
    directory or alias another key).
    """
    if not key:
        raise InvalidKey("empty key")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: "\ud800" in JSON, %ED%A0%80 in a path
        raise InvalidKey("key is not valid Unicode text") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidKey(f"key longer than {MAX_KEY_BYTES} bytes")
    if "\x00" in key:
        raise InvalidKey("key contains NUL")
    if "\\" in key:
        raise InvalidKey("key contains a backslash")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(f"key has an empty, '.' or '..' segment: {key!r}")
    return key


def join_url(base: str, key: str) -> str:
    """Return `base` joined with `key` by exactly one slash."""
    return f"{base.rstrip('/')}/{key}"


# Sent by a daemon on its requests to tier members and http(s) mirrors (`cluster.upstreams`): a
# daemon whose own origin has a tier or mirrors refuses them (508), so that a misconfigured
# tier, or two daemons listed as each other's mirror, cannot send requests round in a loop.
TIER_REQUEST_HEADER = "X-Shardcache-Tier-Request"
# On every error a shardcache daemon answers: the error's kind (`errors`), so a node daemon
# reading through it as a tier member tells the store's throttling ("throttled") and a missing
# object ("not_found") from the member's own trouble (shutting down, no such origin).
ERROR_KIND_HEADER = "X-Shardcache-Error"
