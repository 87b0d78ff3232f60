"""The S3-compatible read API: GetObject, HeadObject, ListObjects(V2), HeadBucket,
GetBucketLocation, ListBuckets, path-style and virtual-hosted, for an S3 client pointed at the
daemon; everything else refused as S3 refuses it. Listings are never cached. Must not know how
an object is served (`objects`) nor how an origin lists."""

from __future__ import annotations

import datetime
import functools
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from aiohttp import web

from shardcache.errors import (
    BadRequest,
    NotSupported,
    OriginNotFound,
    SignatureRefused,
    UnknownOrigin,
)
from shardcache.keys import MAX_KEY_BYTES
from shardcache.origins.listing import (
    MAX_KEYS,
    Listing,
    ListQuery,
    ListVersion,
    rolled_up,
    unwrap_token,
    wrap_token,
)
from shardcache.origins.location import US_EAST_1
from shardcache.serving.access import OPEN_PATHS
from shardcache.serving.middleware import (
    SIGNER_KEY,
    Handler,
    admit_request,
)
from shardcache.serving.objects import get_object, head_object
from shardcache.serving.s3_errors import (
    NAMESPACE,
    S3_KEY,
    XML_TYPE,
    S3Request,
    answer_as_s3,
    new_s3_request,
)
from shardcache.serving.s3_names import View, buckets_of, object_view, views_of
from shardcache.serving.s3_signatures import SignedRequest, is_signed, verify
from shardcache.serving.server_state import CONTEXT_KEY

READS = ("GET", "HEAD")
MAX_TOKEN_CHARS = 4096
VIEWS_TOKEN = "views"  # a page of origins' prefixes shown as folders: the last one it showed
# Subresources and operations that are not reads of objects or listings: refused as S3 does
# for an operation it does not implement.
REFUSED_QUERY = frozenset(
    {
        "partNumber",
        "uploads",
        "uploadId",
        "acl",
        "versionId",
        "versions",
        "tagging",
        "policy",
        "versioning",
        "torrent",
        "retention",
        "legal-hold",
        "attributes",
        "select",
        "restore",
        "cors",
        "lifecycle",
        "website",
        "replication",
        "encryption",
        "logging",
        "notification",
        "requestPayment",
        "object-lock",
        "ownershipControls",
        "publicAccessBlock",
        "accelerate",
        "analytics",
        "inventory",
        "metrics",
        "intelligent-tiering",
        "delete",
    }
)
_EPOCH = 0.0


@web.middleware
async def s3_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve an S3 client's request here (after `admit_request`'s checks, which it runs
    itself in the handler's stead: the route aiohttp matched is not the S3 operation); map
    anyone else's `/BUCKET/KEY` names to an origin and let its route serve it."""
    s3 = new_s3_request(request) or _bare_bucket(request)
    if s3 is None:
        _map_names(request)
        return await handler(request)
    request[S3_KEY] = s3

    # Protected as the path-style request it stands for: a virtual-hosted `/metrics` is the
    # object `metrics`, which needs the token like any other, never the open probe.
    path = f"/{s3.bucket}{request.path}" if s3.is_virtual_host else request.path

    async def admitted(request: web.Request) -> web.StreamResponse:
        if request.method not in READS:  # a write is refused alike, whatever its body holds
            raise web.HTTPMethodNotAllowed(request.method, list(READS))
        _check_signature(request, path)
        return await admit_request(request, serve_s3, path)

    return await answer_as_s3(request, s3, admitted)


def _bare_bucket(request: web.Request) -> S3Request | None:
    """HeadBucket for a plain `HEAD /BUCKET` of a bucket a client can address: what an unsigned
    client sends with no S3 mark (`s5cmd --no-sign-request` asks it first, to learn the
    region). A bare `GET /NAME` keeps the HTTP API's JSON 404 (an unsigned listing carries
    S3's query parameters), as does a HEAD of any other name."""
    segment = request.path[1:]
    if request.method != "HEAD" or not segment or "/" in segment or request.path in OPEN_PATHS:
        return None
    table = request.app[CONTEXT_KEY].state.origins
    if segment not in buckets_of(table.origins.keys(), table.specs):
        return None
    return S3Request(secrets.token_hex(8).upper())


def _check_signature(request: web.Request, path: str) -> None:
    """Where reads need the token and S3 access keys are configured, a signed request's SigV4
    signature: valid, it stands for the token (`SIGNER_KEY`); else S3's error. An unsigned
    request, or one with the token, is left to `admit_request`."""
    access = request.app[CONTEXT_KEY].access
    if not access.s3_keys or not access.is_protected(path):
        return
    headers = request.headers
    authorization = headers.get("Authorization")
    if not is_signed(authorization, list(request.query.keys())):
        return
    if authorization is not None and access.is_authorized(authorization):
        return  # the token, beside a presigned URL's query
    signed = SignedRequest(
        request.method,
        request.rel_url.raw_path,
        request.rel_url.raw_query_string,
        lambda name: headers.getall(name, []),
        list(headers.keys()),
    )
    try:
        request[SIGNER_KEY] = verify(signed, access.s3_keys, time.time())
    except SignatureRefused:
        request.app[CONTEXT_KEY].metrics.client_refusal("unauthorized")
        raise


def _map_names(request: web.Request) -> None:
    """A `GET|HEAD /BUCKET/KEY` from a plain client whose BUCKET names no origin: the origin
    and key `s3_names` maps it to, if any (else its route answers as before)."""
    info = request.match_info
    name, key = info.get("origin"), info.get("key")
    if name is None or key is None or request.method not in READS:
        return
    table = request.app[CONTEXT_KEY].state.origins
    if table.get(name) is not None:
        return
    view = object_view(views_of(name, table.origins.keys(), table.specs), key)
    if view is not None:
        info["origin"], info["key"] = view.origin, view.key_of(key)


def _names(request: web.Request, s3: S3Request) -> tuple[str, str]:
    """The client's bucket ("" for the service) and key ("" for the bucket), decoded from
    the raw path as S3 decodes it (`%2F` is a slash of the key; bytes that are no UTF-8 stay
    undecodable, and the key check refuses them)."""
    raw = request.rel_url.raw_path.removeprefix("/")
    if s3.is_virtual_host:
        assert s3.bucket is not None
        return s3.bucket, unquote(raw, errors="surrogateescape")
    bucket, _, key = raw.partition("/")
    return unquote(bucket, errors="surrogateescape"), unquote(key, errors="surrogateescape")


async def serve_s3(request: web.Request) -> web.StreamResponse:
    """One S3 operation (the module's docstring lists them)."""
    s3 = request[S3_KEY]
    bucket, key = _names(request, s3)
    s3.bucket, s3.key = bucket, key
    refused = REFUSED_QUERY.intersection(request.query.keys())
    if refused:
        raise NotSupported(
            f"{', '.join(sorted(refused))}: not supported; this cache serves reads of whole "
            "objects, ranges and listings only"
        )
    table = request.app[CONTEXT_KEY].state.origins
    names = table.origins.keys()
    if not bucket:
        return _list_buckets(buckets_of(names, table.specs))
    views = views_of(bucket, names, table.specs)
    add_bucket = request.app[CONTEXT_KEY].state.add_bucket
    if not views and add_bucket is not None and await add_bucket(bucket):
        views = views_of(bucket, table.origins.keys(), table.specs)  # `--s3-buckets-on-demand`
    if not views:
        raise UnknownOrigin(f"no configured origin shows a bucket named {bucket!r}")
    if not key:
        if request.method == "HEAD":
            await _head_bucket(request, views)
            return web.Response(headers={"x-amz-bucket-region": "us-east-1"})
        if "location" in request.query:
            region = _escape(await _bucket_location(request, views))
            return _xml(f'<LocationConstraint xmlns="{NAMESPACE}">{region}</LocationConstraint>')
        return await _list_objects(request, bucket, views)
    view = object_view(views, key)
    if view is None:
        raise OriginNotFound(_no_object(bucket, key, views))
    request.match_info["origin"], request.match_info["key"] = view.origin, view.key_of(key)
    if request.method == "HEAD":
        return await head_object(request)
    return await get_object(request)


def _no_object(bucket: str, key: str, views: list[View]) -> str:
    """Why `key` of `bucket` is no object any origin serves, in the words a user can act on: an
    origin's prefix (`datasets/laion/`, with or without its slash) or a folder above it is
    there to be listed, not read; any other key is under no configured prefix."""
    for view in views:
        above = view.prefix.startswith(key) and (key.endswith("/") or view.prefix[len(key)] == "/")
        if above:
            return (
                f"{key!r} in {bucket!r} is a prefix (origin {view.origin!r} serves the keys "
                f"under {view.prefix!r}), not an object: list it, or read a key under it"
            )
    return f"{key!r} is under no configured origin's prefix in {bucket!r}"


async def _head_bucket(request: web.Request, views: list[View]) -> None:
    """HeadBucket: each S3 origin the bucket shows is asked whether its bucket is there and
    readable (a one-key listing under its prefix, kept a minute: `s3_buckets`); a file or
    HTTP origin's bucket is there while it is configured. Raises the origin's refusal."""
    state, cache = request.app[CONTEXT_KEY].state, request.app[CONTEXT_KEY].cache
    one_key = ListQuery(ListVersion.V2, max_keys=1)
    for view in views:
        spec = state.origins.specs.get(view.origin)
        if spec is not None and spec.scheme == "s3":
            ask = functools.partial(cache.list_objects, view.origin, one_key)
            await state.bucket_checks.check(view.origin, ask)


async def _bucket_location(request: web.Request, views: list[View]) -> str:
    """GetBucketLocation: the region of the bucket of the first S3 origin the bucket shows,
    asked of it (kept a minute: `s3_buckets`), as S3's `LocationConstraint` (us-east-1's is
    empty); a bucket only file or HTTP origins show is us-east-1's. Raises the origin's
    refusal."""
    state, cache = request.app[CONTEXT_KEY].state, request.app[CONTEXT_KEY].cache
    for view in views:
        spec = state.origins.specs.get(view.origin)
        if spec is not None and spec.scheme == "s3":
            ask = functools.partial(cache.bucket_location, view.origin)
            return await state.bucket_locations.check(view.origin, ask)
    return US_EAST_1


@dataclass(frozen=True, slots=True)
class ListParams:
    """A listing's parameters as the client sent them (its bucket's key names)."""

    version: ListVersion
    prefix: str
    delimiter: str
    max_keys: int
    start_after: str  # V2's start-after, V1's marker
    token: str | None
    encodes: bool  # encoding-type=url: names percent-encoded in the answer


def parse_list_params(query: Mapping[str, str]) -> ListParams:
    """The listing parameters of `query`, checked; raise BadRequest (InvalidArgument)."""
    list_type = query.get("list-type")
    if list_type not in (None, "2"):
        raise BadRequest(f"list-type must be 2 (or absent, for ListObjects V1), not {list_type!r}")
    version = ListVersion.V2 if list_type == "2" else ListVersion.V1
    raw_max = query.get("max-keys", str(MAX_KEYS))
    if not raw_max.isascii() or not raw_max.isdigit() or len(raw_max) > 10:
        raise BadRequest(f"max-keys must be a whole number from 0, not {raw_max[:20]!r}")
    encoding = query.get("encoding-type")
    if encoding not in (None, "url"):
        raise BadRequest(f"encoding-type must be url, not {encoding[:20]!r}")
    token = query.get("continuation-token") if version is ListVersion.V2 else None
    if token is not None and (not token or len(token) > MAX_TOKEN_CHARS):
        raise BadRequest("the continuation token provided is incorrect")
    after = query.get("start-after" if version is ListVersion.V2 else "marker", "")
    texts = {"prefix": query.get("prefix", ""), "delimiter": query.get("delimiter", "")}
    for name, value in (*texts.items(), ("start-after", after)):
        if "\x00" in value or len(value.encode("utf-8", "surrogateescape")) > MAX_KEY_BYTES:
            raise BadRequest(f"{name} must be under {MAX_KEY_BYTES} bytes, without NUL")
    return ListParams(
        version,
        texts["prefix"],
        texts["delimiter"],
        min(int(raw_max), MAX_KEYS),
        after,
        token,
        encoding == "url",
    )


async def _list_objects(request: web.Request, bucket: str, views: list[View]) -> web.Response:
    """One page of the bucket's keys, asked of the origin whose prefix holds the client's."""
    params = parse_list_params(request.query)
    listing, prefix_of_view = await _listing(request, params, views)
    return _xml(_listing_xml(bucket, params, listing, prefix_of_view))


async def _listing(
    request: web.Request, params: ListParams, views: list[View]
) -> tuple[Listing, str]:
    """The page for `params` and the view prefix its names are relative to."""
    prefix = params.prefix
    for view in views:  # longest prefix first
        if prefix.startswith(view.prefix):
            return await _ask(request, params, view, prefix[len(view.prefix) :]), view.prefix
    above = [view for view in views if view.prefix.startswith(prefix)]
    rolled = {rolled_up(view.prefix, prefix, params.delimiter) for view in above}
    if above and None not in rolled:  # the origins' prefixes, as the client's folders
        return _folders(params, {p for p in rolled if p is not None}), ""
    if len(above) == 1:
        return await _ask(request, params, above[0], ""), above[0].prefix
    if above:
        raise NotSupported(
            f"prefix {prefix!r} spans several origins' prefixes; list under one of them"
        )
    return Listing(), ""


def _folders(params: ListParams, folders: set[str]) -> Listing:
    """One page of `folders` (origins' prefixes shown as the client's common prefixes), after
    the token's or the start's; truncated, with where the next page starts, when more follow.
    Raises BadRequest for a token this page did not make."""
    after = unwrap_token(VIEWS_TOKEN, params.token) if params.token else params.start_after
    found = sorted(p for p in folders if p > after)
    page = tuple(found[: params.max_keys])
    if not page or len(found) == len(page):
        return Listing(common_prefixes=page)
    return Listing(
        common_prefixes=page,
        is_truncated=True,
        next_token=wrap_token(VIEWS_TOKEN, page[-1]),
        next_marker=page[-1],
    )


async def _ask(request: web.Request, params: ListParams, view: View, origin_prefix: str) -> Listing:
    after = params.start_after
    if after.startswith(view.prefix):
        after = after[len(view.prefix) :]
    elif after < view.prefix:
        after = ""
    else:
        return Listing()  # every key of this view sorts before the start
    query = ListQuery(
        params.version, origin_prefix, params.delimiter, params.max_keys, after, params.token
    )
    return await request.app[CONTEXT_KEY].cache.list_objects(view.origin, query)


def _listing_xml(bucket: str, params: ListParams, listing: Listing, under: str) -> str:
    def name(value: str) -> str:
        return quote(value, safe="/") if params.encodes else _escape(value)

    is_v2 = params.version is ListVersion.V2
    parts = [f"<Name>{_escape(bucket)}</Name><Prefix>{name(params.prefix)}</Prefix>"]
    if not is_v2:
        parts.append(f"<Marker>{name(params.start_after)}</Marker>")
    parts.append(f"<MaxKeys>{params.max_keys}</MaxKeys>")
    if params.delimiter:
        parts.append(f"<Delimiter>{name(params.delimiter)}</Delimiter>")
    if params.encodes:
        parts.append("<EncodingType>url</EncodingType>")
    objects = [o for o in listing.objects if params.encodes or _fits_xml(o.key)]
    prefixes = [p for p in listing.common_prefixes if params.encodes or _fits_xml(p)]
    parts.append(f"<IsTruncated>{'true' if listing.is_truncated else 'false'}</IsTruncated>")
    if is_v2:
        parts.append(f"<KeyCount>{len(objects) + len(prefixes)}</KeyCount>")
        if params.token:
            parts.append(f"<ContinuationToken>{_escape(params.token)}</ContinuationToken>")
        if listing.is_truncated and listing.next_token:
            parts.append(
                f"<NextContinuationToken>{_escape(listing.next_token)}</NextContinuationToken>"
            )
        if params.start_after:
            parts.append(f"<StartAfter>{name(params.start_after)}</StartAfter>")
    elif listing.is_truncated and listing.next_marker:
        parts.append(f"<NextMarker>{name(under + listing.next_marker)}</NextMarker>")
    for item in objects:
        etag = f"<ETag>{_escape(item.etag)}</ETag>" if item.etag else ""
        parts.append(
            f"<Contents><Key>{name(under + item.key)}</Key>"
            f"<LastModified>{_iso(item.last_modified)}</LastModified>{etag}"
            f"<Size>{item.size_bytes}</Size><StorageClass>STANDARD</StorageClass></Contents>"
        )
    for common in prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{name(under + common)}</Prefix></CommonPrefixes>")
    return f'<ListBucketResult xmlns="{NAMESPACE}">{"".join(parts)}</ListBucketResult>'


def _list_buckets(buckets: list[str]) -> web.Response:
    listed = "".join(
        f"<Bucket><Name>{_escape(b)}</Name><CreationDate>{_iso(_EPOCH)}</CreationDate></Bucket>"
        for b in buckets
    )
    return _xml(
        f'<ListAllMyBucketsResult xmlns="{NAMESPACE}"><Owner><ID>shardcache</ID>'
        f"<DisplayName>shardcache</DisplayName></Owner><Buckets>{listed}</Buckets>"
        "</ListAllMyBucketsResult>"
    )


def _xml(document: str) -> web.Response:
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n{document}'.encode("utf-8", "surrogateescape")
    return web.Response(body=body, content_type=XML_TYPE)


def _fits_xml(value: str) -> bool:
    """Whether XML 1.0 text can carry `value` as it is (no control characters)."""
    return all(c >= " " and not "\ud800" <= c <= "\udfff" for c in value)


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _iso(seconds: float | None) -> str:
    moment = datetime.datetime.fromtimestamp(seconds or _EPOCH, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
