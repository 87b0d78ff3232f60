"""A bucket's location as S3's GetBucketLocation gives it (`LocationConstraint`: empty for
us-east-1, `EU` for the oldest eu-west-1 buckets, else the region's name). Optional for a
backend, as listing is: an S3 origin is a `Locator`; a wrapper passes the question on with
`bucket_location`; any other origin answers us-east-1's empty constraint."""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

from shardcache.errors import OriginUnavailable

US_EAST_1 = ""  # the constraint S3 answers for us-east-1, its default region
# A region's name: S3's (`eu-west-1`, `us-gov-west-1`, the oldest buckets' `EU`) or another
# store's own (MinIO's, SeaweedFS's), never spaces, markup or control characters.
_REGION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@runtime_checkable
class Locator(Protocol):
    """A backend (or a wrapper) that knows the region of its bucket."""

    name: str

    async def bucket_location(self) -> str:
        """The bucket's `LocationConstraint` as the store answers it; raise an OriginError
        (BucketNotFound for a missing bucket, OriginDenied, …) when it cannot be had."""
        ...


async def bucket_location(origin: object) -> str:
    """`origin`'s bucket's `LocationConstraint`, or us-east-1's when it is no `Locator`.
    Raises the origin's OriginError, or OriginUnavailable when its answer is no region's
    name (no XML document at all, a page of HTML: a store, or a proxy before it, that answers
    wrongly; asked again next time, never kept as the bucket's region)."""
    if not isinstance(origin, Locator):
        return US_EAST_1
    try:
        region = await origin.bucket_location()
    except SyntaxError as exc:  # xml.etree's ParseError: botocore parses this answer itself
        raise OriginUnavailable(
            f"origin {origin.name!r}: its bucket's location is no XML document ({exc})"
        ) from exc
    if region != US_EAST_1 and not _REGION.fullmatch(region):
        raise OriginUnavailable(
            f"origin {origin.name!r}: its bucket's location {region[:40]!r} is no region's name"
        )
    return region
