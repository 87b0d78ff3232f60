"""Listing an origin's keys: the query, the page it answers, and who can answer it.

The S3-compatible API (`serving.s3_api`) lists a bucket by asking the origin behind it: an S3
origin passes the query to its bucket (ListObjectsV2 or V1), a file origin walks its directory
(`file_listing`), an HTTP origin cannot list (`NotSupported`, which the API answers as S3's
`NotImplemented`). Listing is optional for a backend: one that lists is a `Lister`; a wrapper
(caps, failover) passes the query to the backend it wraps with `list_objects`.

Keys here are the origin's own (relative to its prefix or root), as `/NAME/KEY` names them;
the serving side adds back whatever prefix its client's bucket view has. Tokens are the
origin's, opaque to everyone else: a file origin's is the last name it answered, an S3
origin's the store's own continuation token, each wrapped so that one origin's token is never
taken for another's and garbage is refused (`BadRequest`) instead of passed on.
"""

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
