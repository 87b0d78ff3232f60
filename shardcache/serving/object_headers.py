"""An object's answer before its body: the status and headers of a GET or HEAD (the HTTP
contract's one place), the 304 or 412 its preconditions call for, and the range it wants.
Pure over the request's fields and the object's validators: no cache, no sending."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from shardcache.cache.lease import Result
from shardcache.checksums import Checksum, to_headers
from shardcache.keys import ERROR_KIND_HEADER
from shardcache.serving.conditionals import (
    Outcome,
    Validators,
    evaluate,
    fields_of,
    http_date,
    quoting_bare_etags,
    range_applies,
)
from shardcache.serving.middleware import json_error
from shardcache.serving.ranges import ByteRange, parse_range
from shardcache.serving.s3_errors import S3_KEY

DEFAULT_CONTENT_TYPE = "application/octet-stream"


def object_response(
    result: Result,
    size_bytes: int,
    etag: str | None,
    content_type: str | None,
    byte_range: ByteRange | None,
    checksums: tuple[Checksum, ...] = (),
    verified_by: tuple[str, ...] = (),
    last_modified: float | None = None,
) -> web.StreamResponse:
    """The status and headers of a GET or HEAD of an object (the HTTP contract's one place:
    `object_fields` gives its fields, in order)."""
    fields = object_fields(
        result, etag, content_type, byte_range, checksums, verified_by, last_modified
    )
    response = web.StreamResponse(status=206 if byte_range else 200, headers=fields)
    if byte_range is not None:
        response.headers["Content-Range"] = byte_range.content_range(size_bytes)
    response.content_length = byte_range.length if byte_range else size_bytes
    return response


def object_fields(
    result: Result,
    etag: str | None,
    content_type: str | None,
    byte_range: ByteRange | None,
    checksums: tuple[Checksum, ...] = (),
    verified_by: tuple[str, ...] = (),
    last_modified: float | None = None,
) -> dict[str, str]:
    """An object answer's fields but its length and range, in the order they are sent.

    A whole-object answer republishes the checksums the cache verified (`Content-MD5`,
    `x-amz-checksum-*`), so a shardcache tier below can verify end to end as well; a hit says
    what its entry was verified against (`X-Shardcache-Verified: length, Content-MD5`).
    """
    fields = {
        "Accept-Ranges": "bytes",
        "Content-Type": content_type or DEFAULT_CONTENT_TYPE,
        "X-Shardcache": result.value,
    }
    if etag:
        fields["ETag"] = etag
    if last_modified is not None:
        fields["Last-Modified"] = http_date(last_modified)
    if verified_by:
        fields["X-Shardcache-Verified"] = ", ".join(verified_by)
    if byte_range is None:
        fields.update(to_headers(checksums))
    return fields


def precondition_response(
    request: web.Request, result: Result, validators: Validators
) -> web.StreamResponse | None:
    """The 304 or 412 that the request's preconditions call for (RFC 9110 §13.2.2), or None
    to answer with the object.

    A 304 carries the validators a cache needs to update what it holds (§15.4.5) and no
    body; a 412 is a JSON error like any other."""
    outcome = evaluate(conditional_fields(request), validators)
    if outcome is Outcome.PROCEED:
        return None
    headers = {"X-Shardcache": result.value}
    if validators.etag:
        headers["ETag"] = validators.etag
    if validators.last_modified is not None:
        headers["Last-Modified"] = http_date(validators.last_modified)
    if outcome is Outcome.NOT_MODIFIED:
        return web.Response(status=304, headers=headers)
    headers[ERROR_KIND_HEADER] = "precondition"
    return json_error(412, "a precondition of the request does not hold", headers)


def conditional_fields(request: web.Request) -> Mapping[str, str]:
    """The request's conditional fields; an S3 client's bare ETags quoted, as S3 reads them."""
    fields = fields_of(request.headers)
    return quoting_bare_etags(fields) if request.get(S3_KEY) is not None else fields


def wanted_range(request: web.Request, validators: Validators, size_bytes: int) -> ByteRange | None:
    """The range to send, or None for the whole object: RFC 9110 §13.1.5, an If-Range that
    does not hold means the whole object with a 200. Raises RangeNotSatisfiable."""
    if "Range" not in request.headers:
        return None
    if not range_applies(conditional_fields(request), validators):
        return None
    return parse_range(request.headers.get("Range"), size_bytes)
