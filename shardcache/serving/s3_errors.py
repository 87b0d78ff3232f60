"""S3's answers to S3 clients: which requests are theirs (`is_s3_request`), the
`x-amz-request-id` every answer carries, and errors as S3's XML with S3's codes and statuses
(the JSON path's errors, counted and logged there once). Must not know how a request is
served (`s3_api`, `objects`)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from xml.sax.saxutils import escape

from aiohttp import web

from shardcache.errors import BadRequest as BadRequestError
from shardcache.errors import (
    BucketNotFound,
    CacheError,
    CrossSite,
    InvalidKey,
    NotSupported,
    OriginDenied,
    OriginError,
    OriginNotFound,
    OriginShed,
    OriginThrottled,
    QueueFull,
    RangeNotSatisfiable,
    RequestTimeout,
    ShuttingDown,
    SignatureRefused,
    Unauthorized,
    UnknownOrigin,
)
from shardcache.serving.access import ADMIN_PREFIX, OPEN_PATHS
from shardcache.serving.middleware import Handler, errors_as_json
from shardcache.serving.s3_names import bucket_of_host

XML_TYPE = "application/xml"
NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"

# Query parameters only an S3 client sends (operations, listing, presigned URLs).
S3_QUERY = frozenset(
    {
        "list-type",
        "prefix",
        "delimiter",
        "marker",
        "max-keys",
        "continuation-token",
        "start-after",
        "encoding-type",
        "fetch-owner",
        "location",
        "partNumber",
        "uploads",
        "uploadId",
        "acl",
        "versionId",
        "versions",
        "tagging",
        "policy",
        "versioning",
        "x-id",
        "X-Amz-Algorithm",
        "X-Amz-Signature",
        "AWSAccessKeyId",
    }
)

# An exception class (most specific first) -> S3's status and code.
_CODES: tuple[tuple[type[BaseException], int, str], ...] = (
    (BucketNotFound, 404, "NoSuchBucket"),
    (UnknownOrigin, 404, "NoSuchBucket"),
    (OriginNotFound, 404, "NoSuchKey"),
    (RangeNotSatisfiable, 416, "InvalidRange"),
    (InvalidKey, 400, "InvalidArgument"),
    (BadRequestError, 400, "InvalidArgument"),
    (RequestTimeout, 400, "RequestTimeout"),
    (Unauthorized, 403, "AccessDenied"),
    (CrossSite, 403, "AccessDenied"),
    (OriginDenied, 403, "AccessDenied"),
    (OriginThrottled, 503, "SlowDown"),
    (OriginShed, 503, "SlowDown"),
    (QueueFull, 503, "SlowDown"),
    (ShuttingDown, 503, "ServiceUnavailable"),
    (NotSupported, 501, "NotImplemented"),
    (OriginError, 503, "ServiceUnavailable"),
    (CacheError, 503, "ServiceUnavailable"),
)
# A status -> S3's code, for an error answered rather than raised (a 412, aiohttp's 405).
_BY_STATUS = {
    400: "InvalidRequest",
    403: "AccessDenied",
    404: "NoSuchKey",
    405: "MethodNotAllowed",
    412: "PreconditionFailed",
    413: "EntityTooLarge",
    415: "InvalidRequest",
    416: "InvalidRange",
    501: "NotImplemented",
    503: "ServiceUnavailable",
}
_KEPT_HEADERS = ("Retry-After", "Content-Range", "Allow", "WWW-Authenticate", "Connection")


@dataclass(slots=True)
class S3Request:
    """What is known of an S3 client's request: its id, and the bucket and key it names (the
    client's own names, for the error's `BucketName` and `Key`)."""

    request_id: str
    bucket: str | None = None  # from `Host` when virtual-hosted
    is_virtual_host: bool = False
    key: str = ""


S3_KEY = web.RequestKey("s3_request", S3Request)  # request[S3_KEY]: set on an S3 client's request


# What AWS's SDKs and tools put in `User-Agent`, for the one request of theirs with no other mark:
# an unsigned one that asks for no checksum (`Boto3/… md/Botocore#…`, `aws-cli/…`,
# `aws-sdk-go/…`, `aws-sdk-java/…`, the CRT's `aws-crt-…`).
SDK_AGENTS = ("botocore", "aws-cli/", "aws-sdk-", "aws-crt")


def is_s3_request(request: web.Request, host_bucket: str | None) -> bool:
    """Whether `request` is an S3 client's (the module's docstring gives the rule)."""
    if host_bucket is not None:
        return True
    path = request.path
    if path.startswith(ADMIN_PREFIX) or path in OPEN_PATHS:
        return False
    headers = request.headers
    authorization = headers.get("Authorization")
    if authorization is not None and authorization.startswith(("AWS4-", "AWS ")):
        return True
    if any(name[:6].lower() == "x-amz-" for name in headers):
        return True
    user_agent = headers.get("User-Agent", "").lower()
    if any(sdk in user_agent for sdk in SDK_AGENTS):
        return True
    return bool(request.query_string) and not S3_QUERY.isdisjoint(request.query.keys())


def error_xml(code: str, message: str, request_id: str, **fields: str) -> bytes:
    """S3's `<Error>` document: the code, a message, the named `fields` (`Key`,
    `BucketName`), the request id."""
    parts = [f"<Code>{code}</Code><Message>{_text(message)}</Message>"]
    parts += [f"<{name}>{_text(value)}</{name}>" for name, value in fields.items() if value]
    parts.append(f"<RequestId>{request_id}</RequestId>")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<Error>{"".join(parts)}</Error>'.encode()


def _text(value: str) -> str:
    """`value` as XML 1.0 text: escaped, and with the characters XML cannot carry (control
    characters, and bytes that were no UTF-8, a key or message may hold) shown as `?`."""
    cleaned = "".join(
        "?" if (c < " " and c not in "\t\n\r") or "\ud800" <= c <= "\udfff" else c for c in value
    )
    return escape(cleaned)


def code_of(exc: BaseException) -> tuple[int, str]:
    """S3's status and code for `exc`; an unexpected one is an InternalError (a bug)."""
    if isinstance(exc, SignatureRefused):
        return exc.status, exc.code
    for cls, status, code in _CODES:
        if isinstance(exc, cls):
            return status, code
    if isinstance(exc, web.HTTPException):
        return exc.status, _BY_STATUS.get(exc.status, "InvalidRequest")
    return 500, "InternalError"


def s3_error(
    s3: S3Request,
    status: int,
    code: str,
    message: str,
    answered: web.Response,
    extra: dict[str, str] | None = None,
) -> web.Response:
    """The XML answer to an S3 client for an error `answered` as JSON (its headers kept);
    `extra`: the fields S3 adds for the code (`StringToSign`, `ServerTime`, …)."""
    fields = {"BucketName": s3.bucket or ""} if code == "NoSuchBucket" else {"Key": s3.key}
    fields.update(extra or {})
    body = error_xml(code, message, s3.request_id, **fields)
    headers = {name: answered.headers[name] for name in _KEPT_HEADERS if name in answered.headers}
    if code == "SlowDown" and "Retry-After" not in headers:
        headers["Retry-After"] = "1"
    response = web.Response(status=status, body=body, content_type=XML_TYPE, headers=headers)
    if answered.keep_alive is False:
        response.force_close()
    return response


def _message_of(answered: web.Response) -> str:
    try:
        document = json.loads(answered.body or b"{}")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return answered.reason or ""
    return str(document.get("error", "")) if isinstance(document, dict) else ""


def is_json_error(response: web.StreamResponse) -> bool:
    return (
        isinstance(response, web.Response)
        and not response.prepared
        and response.status >= 400
        and response.content_type == "application/json"
    )


async def answer_as_s3(request: web.Request, s3: S3Request, handler: Handler) -> web.StreamResponse:
    """Run `handler` for an S3 client: an error raised or answered as JSON becomes S3's XML."""
    try:
        response = await handler(request)
    except Exception as exc:
        if isinstance(exc, ConnectionError) or (
            isinstance(exc, web.HTTPException) and exc.status < 400
        ):
            raise

        failure = exc

        async def reraise(_: web.Request) -> web.StreamResponse:
            raise failure

        answered = await errors_as_json(request, reraise)  # counted and logged as for JSON
        if not isinstance(answered, web.Response):
            return answered
        status, code = code_of(exc)
        extra = exc.fields if isinstance(exc, SignatureRefused) else None
        return s3_error(s3, status, code, _message_of(answered), answered, extra)
    if is_json_error(response):
        assert isinstance(response, web.Response)
        code = _BY_STATUS.get(response.status, "InternalError")
        return s3_error(s3, response.status, code, _message_of(response), response)
    return response


def new_s3_request(request: web.Request) -> S3Request | None:
    """An `S3Request` for an S3 client's request, or None for anyone else's."""
    bucket = bucket_of_host(request.headers.get("Host"))
    if not is_s3_request(request, bucket):
        return None
    return S3Request(secrets.token_hex(8).upper(), bucket, bucket is not None)


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: an S3 client's every answer carries `x-amz-request-id`."""
    s3 = request.get(S3_KEY)
    if s3 is not None:
        response.headers["x-amz-request-id"] = s3.request_id
