"""Listing an origin's keys: the query, the page it answers, and who can answer it (`Lister`:
S3 and file origins; an HTTP origin raises `NotSupported`; wrappers pass the query on).

Keys are the origin's own, relative to its prefix or root. Tokens are opaque and wrapped per
origin, so one origin's token is never taken for another's and garbage is `BadRequest`."""

from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from shardcache.errors import BadRequest, NotSupported

MAX_KEYS = 1000  # S3's own cap on one page


class ListVersion(enum.Enum):
    V1 = 1  # marker / NextMarker (older tools: `aws s3 ls` before 2016, s3fs's fallback)
    V2 = 2  # continuation-token / start-after


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One page asked of an origin: keys under `prefix` after `start_after` (V1's marker,
    V2's start-after) or after where `token` left off, rolled up at `delimiter`, at most
    `max_keys` of keys and common prefixes together."""

    version: ListVersion
    prefix: str = ""
    delimiter: str = ""
    max_keys: int = MAX_KEYS
    start_after: str = ""
    token: str | None = None  # V2's continuation token, as `Listing.next_token` gave it


@dataclass(frozen=True, slots=True)
class ListedObject:
    key: str
    size_bytes: int
    etag: str | None = None
    last_modified: float | None = None  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class Listing:
    """One page: the keys and the common prefixes (in key order), whether more follow, and
    where the next page starts (`next_token` for V2, `next_marker` for V1)."""

    objects: tuple[ListedObject, ...] = ()
    common_prefixes: tuple[str, ...] = ()
    is_truncated: bool = False
    next_token: str | None = None
    next_marker: str | None = None


@runtime_checkable
class Lister(Protocol):
    """A backend (or a wrapper) that can list its keys."""

    name: str

    async def list_objects(self, query: ListQuery) -> Listing:
        """One page of keys for `query`; raise BadRequest for a token that is not this
        origin's, NotSupported when the backend cannot list, or an OriginError."""
        ...


async def list_objects(origin: object, query: ListQuery) -> Listing:
    """`origin`'s answer to `query`, or NotSupported when it is no `Lister`."""
    if not isinstance(origin, Lister):
        name = getattr(origin, "name", "?")
        raise NotSupported(f"origin {name!r} cannot list its keys (only S3 and file origins can)")
    return await origin.list_objects(query)


def wrap_token(kind: str, inner: str) -> str:
    """A continuation token that says which kind of origin made it (`kind`), around `inner`."""
    return base64.urlsafe_b64encode(f"{kind}:{inner}".encode("utf-8", "surrogateescape")).decode()


def unwrap_token(kind: str, token: str) -> str:
    """The `inner` of a token `wrap_token(kind, …)` made; raise BadRequest for any other."""
    try:
        text = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8", "surrogateescape")
    except (binascii.Error, UnicodeEncodeError, ValueError):
        text = ""
    found, colon, inner = text.partition(":")
    if found != kind or not colon:
        raise BadRequest("the continuation token provided is incorrect")
    return inner


def rolled_up(key: str, prefix: str, delimiter: str) -> str | None:
    """The common prefix `key` rolls up into under `prefix` and `delimiter`, or None when it
    is listed as itself (S3's rule: up to and including the first delimiter after the
    prefix)."""
    if not delimiter:
        return None
    at = key.find(delimiter, len(prefix))
    return None if at < 0 else key[: at + len(delimiter)]
