"""A bucket's location as S3's GetBucketLocation gives it (`LocationConstraint`: empty for
us-east-1, `EU` for the oldest eu-west-1 buckets, else the region's name). Optional for a
backend, as listing is: an S3 origin is a `Locator`; a wrapper passes the question on with
`bucket_location`; any other origin answers us-east-1's empty constraint."""

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
