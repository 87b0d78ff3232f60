"""A bucket's location: the region an S3 origin's bucket was made in, as S3's
GetBucketLocation gives it (`LocationConstraint`: empty for us-east-1, `EU` for the oldest
eu-west-1 buckets, else the region's name).

Knowing it is optional for a backend, as listing is: one with a bucket is a `Locator` (an
S3 origin asks its store, with the daemon's credentials); a wrapper (caps, failover) passes
the question to the backend it wraps with `bucket_location`; any other origin (a file root,
an HTTP server) has no region and answers us-east-1's empty constraint, as S3's API
answers for its default region.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

US_EAST_1 = ""  # the constraint S3 answers for us-east-1, its default region


@runtime_checkable
class Locator(Protocol):
    """A backend (or a wrapper) that knows the region of its bucket."""

    name: str

    async def bucket_location(self) -> str:
        """The bucket's `LocationConstraint` as the store answers it; raise an OriginError
        (BucketNotFound for a missing bucket, OriginDenied, …) when it cannot be had."""
        ...


async def bucket_location(origin: object) -> str:
    """`origin`'s bucket's `LocationConstraint`, or us-east-1's when it is no `Locator`."""
    if not isinstance(origin, Locator):
        return US_EAST_1
    return await origin.bucket_location()
