"""AWS Signature Version 4 as S3 checks it, header and presigned forms, against the access keys
the daemon is configured with (pure: the request's parts and the clock in). Refused as S3
refuses (`SignatureRefused` with S3's code); a secret is never put in a message or a log.
Must not know aiohttp, where the keys come from, or who may read what (`access`)."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote_plus, unquote_to_bytes

from shardcache.errors import SignatureRefused

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
TERMINATOR = "aws4_request"
MAX_SKEW_S = 15 * 60
MAX_EXPIRES_S = 7 * 24 * 3600  # a presigned URL lives a week at most
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
PRESIGNED_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)
_QUERY_CREDENTIALS = frozenset(
    {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "AWSAccessKeyId"}
)
_AMZ_DATE = "%Y%m%dT%H%M%SZ"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SPACES = re.compile(r"\s+")
_UNSUPPORTED = (
    "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
)


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """The parts of a request a signature covers, as they came over the wire."""

    method: str
    raw_path: str  # percent-encoded, as sent
    raw_query: str  # without the "?", as sent
    header: Callable[[str], Sequence[str]]  # every value of a header (case-insensitive name)
    header_names: Sequence[str]  # the request's header names


def is_signed(authorization: str | None, query_names: Sequence[str]) -> bool:
    """Whether a request carries AWS credentials of any version (a header or a presigned URL)."""
    if authorization is not None and authorization.startswith(("AWS4-", "AWS ")):
        return True
    return not _QUERY_CREDENTIALS.isdisjoint(query_names)


def verify(request: SignedRequest, keys: Mapping[str, str], now: float) -> str:
    """Return the access key id `request` was validly signed with at time `now` (seconds since
    the epoch). Raise SignatureRefused with S3's code for anything else."""
    query = _parse_query(request.raw_query)
    names = {name for name, _ in query}
    authorization = _one(request.header("Authorization"))
    is_presigned = not names.isdisjoint(PRESIGNED_PARAMS)
    if authorization is not None and is_presigned:
        raise SignatureRefused(
            "InvalidArgument",
            "Only one auth mechanism allowed; only the X-Amz-Algorithm "
            "query parameter or the Authorization header should be specified",
            400,
        )
    if is_presigned:
        signed = _presigned(dict(query), now)
    elif authorization is not None and authorization.startswith(ALGORITHM + " "):
        signed = _from_header(authorization, request, now)
    elif (authorization is not None and authorization.startswith("AWS ")) or (
        "AWSAccessKeyId" in names
    ):
        raise SignatureRefused("InvalidRequest", _UNSUPPORTED, 400)
    else:
        raise SignatureRefused("AccessDenied", "Access Denied: the request is not signed")
    _check_all_amz_signed(request, signed.headers)
    secret = keys.get(signed.key_id)
    if secret is None:
        raise SignatureRefused(
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
            fields={"AWSAccessKeyId": signed.key_id},
        )
    canonical = canonical_request(request, query, signed.headers, signed.payload_hash)
    to_sign = string_to_sign(signed.amz_date, signed.scope, canonical)
    expected = signature(secret, signed.scope, to_sign)
    provided = signed.signature.encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(expected.encode(), provided):
        raise SignatureRefused(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method.",
            fields={
                "AWSAccessKeyId": signed.key_id,
                "StringToSign": to_sign,
                "SignatureProvided": signed.signature,
                "CanonicalRequest": canonical,
            },
        )
    return signed.key_id


@dataclass(frozen=True, slots=True)
class _Signed:
    """What a request claims: who signed, when, for which scope, over which headers."""

    key_id: str
    scope: str  # DATE/REGION/s3/aws4_request
    amz_date: str  # the request's time as signed (YYYYMMDDTHHMMSSZ)
    headers: tuple[str, ...]  # the signed header names, lowercase, as listed
    signature: str
    payload_hash: str


def canonical_request(
    request: SignedRequest,
    query: Sequence[tuple[str, str]],
    signed_headers: Sequence[str],
    payload_hash: str,
) -> str:
    """SigV4's canonical request, with the path and query encoded as S3 encodes them."""
    path = quote(unquote_to_bytes(request.raw_path or "/"), safe="/~")
    pairs = sorted(
        (_encode(name), _encode(value)) for name, value in query if name != "X-Amz-Signature"
    )
    canonical_query = "&".join(f"{name}={value}" for name, value in pairs)
    lines = [
        f"{name}:{','.join(_SPACES.sub(' ', v.strip()) for v in request.header(name))}"
        for name in signed_headers
    ]
    return "\n".join(
        (
            request.method,
            path,
            canonical_query,
            "\n".join(lines) + "\n",
            ";".join(signed_headers),
            payload_hash,
        )
    )


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def signature(secret: str, scope: str, to_sign: str) -> str:
    """The hex signature of `to_sign` by the key derived from `secret` for `scope`."""
    key = ("AWS4" + secret).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _encode(value: str) -> str:
    """S3's UriEncode: every byte but the unreserved characters as %XX, the slash included."""
    return quote(value.encode("utf-8", "surrogateescape"), safe="~")


def _parse_query(raw_query: str) -> list[tuple[str, str]]:
    pairs = []
    for piece in raw_query.split("&"):
        if piece:
            name, _, value = piece.partition("=")
            pairs.append(
                (
                    unquote_plus(name, errors="surrogateescape"),
                    unquote_plus(value, errors="surrogateescape"),
                )
            )
    return pairs


def _one(values: Sequence[str]) -> str | None:
    return values[0] if values else None


def _malformed(message: str) -> SignatureRefused:
    return SignatureRefused(
        "AuthorizationHeaderMalformed", f"The authorization header is malformed; {message}", 400
    )


def _from_header(authorization: str, request: SignedRequest, now: float) -> _Signed:
    """The claims of an `Authorization: AWS4-HMAC-SHA256 …` header, their time checked."""
    fields: dict[str, str] = {}
    for part in authorization[len(ALGORITHM) + 1 :].split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name in fields:
            raise _malformed(f"the part {part.strip()[:40]!r} is not NAME=VALUE, once each")
        fields[name] = value.strip()
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise _malformed("it needs Credential, SignedHeaders and Signature, and nothing else")
    key_id, date, scope = _credential(fields["Credential"], _malformed)
    amz_date = _one(request.header("x-amz-date"))
    moment = _parse_time(amz_date) if amz_date is not None else None
    if moment is None:
        raise SignatureRefused(
            "AccessDenied", "AWS authentication requires a valid x-amz-date header"
        )
    assert amz_date is not None
    if amz_date[:8] != date:
        raise _malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
    _check_skew(amz_date, moment, now)
    payload_hash = _one(request.header("x-amz-content-sha256"))
    if payload_hash is None:
        raise SignatureRefused(
            "InvalidRequest", "Missing required header for this request: x-amz-content-sha256", 400
        )
    _check_payload_hash(payload_hash)
    headers = _signed_headers(fields["SignedHeaders"], _malformed)
    return _Signed(key_id, scope, amz_date, headers, fields["Signature"], payload_hash)


def _presigned(query: Mapping[str, str], now: float) -> _Signed:
    """The claims of a presigned URL's query, its time and expiry checked."""

    def malformed(message: str) -> SignatureRefused:
        return SignatureRefused("AuthorizationQueryParametersError", message, 400)

    missing = [name for name in PRESIGNED_PARAMS if name not in query]
    if missing:
        raise malformed(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, "
            "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and "
            f"X-Amz-Expires parameters (missing: {', '.join(missing)})."
        )
    if query["X-Amz-Algorithm"] != ALGORITHM:
        raise malformed(f'X-Amz-Algorithm only supports "{ALGORITHM}"')
    key_id, date, scope = _credential(query["X-Amz-Credential"], malformed)
    amz_date = query["X-Amz-Date"]
    moment = _parse_time(amz_date)
    if moment is None:
        raise malformed("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"")
    if amz_date[:8] != date:
        raise malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
    raw_expires = query["X-Amz-Expires"]
    if not raw_expires.isascii() or not raw_expires.isdigit() or len(raw_expires) > 7:
        raise malformed("X-Amz-Expires should be a number")
    expires_s = int(raw_expires)
    if expires_s > MAX_EXPIRES_S:
        raise malformed(
            f"X-Amz-Expires must be less than a week (in seconds) that is {MAX_EXPIRES_S}"
        )
    if moment > now + MAX_SKEW_S:
        raise SignatureRefused("AccessDenied", "Request is not valid yet")
    if now > moment + expires_s:
        raise SignatureRefused(
            "AccessDenied",
            "Request has expired",
            fields={
                "X-Amz-Expires": raw_expires,
                "Expires": _iso(moment + expires_s),
                "ServerTime": _iso(now),
            },
        )
    payload_hash = query.get("X-Amz-Content-Sha256", UNSIGNED_PAYLOAD)
    _check_payload_hash(payload_hash)
    headers = _signed_headers(query["X-Amz-SignedHeaders"], malformed)
    return _Signed(key_id, scope, amz_date, headers, query["X-Amz-Signature"], payload_hash)


def _credential(
    credential: str, malformed: Callable[[str], SignatureRefused]
) -> tuple[str, str, str]:
    """The key id, date and scope of `KEYID/DATE/REGION/s3/aws4_request`."""
    parts = credential.split("/")
    if len(parts) != 5 or not all(parts):
        raise malformed(f"the Credential {credential[:80]!r} is not KEY/DATE/REGION/s3/aws4_…")
    key_id, date, region, service, terminator = parts
    if len(date) != 8 or not date.isascii() or not date.isdigit():
        raise malformed(f"incorrect date format {date[:20]!r}. This date should be YYYYMMDD")
    if service != SERVICE:
        raise malformed(f'incorrect service {service[:20]!r}. This endpoint belongs to "s3".')
    if terminator != TERMINATOR:
        raise malformed(f'incorrect terminal {terminator[:20]!r}. This should be "aws4_request".')
    if not region.isascii() or len(region) > 64:
        raise malformed(f"the region {region[:20]!r} is no region's name")
    return key_id, date, "/".join(parts[1:])


def _signed_headers(listed: str, malformed: Callable[[str], SignatureRefused]) -> tuple[str, ...]:
    """The signed header names: lowercase, `host` among them (S3 requires it signed)."""
    names = tuple(listed.split(";"))
    if not all(names) or any(name != name.lower() for name in names):
        raise malformed("SignedHeaders must be lowercase names separated by ';'")
    if "host" not in names:
        raise malformed("the Host header must be signed (SignedHeaders has no host)")
    return names


def _check_all_amz_signed(request: SignedRequest, signed: Sequence[str]) -> None:
    """S3 refuses an `x-amz-*` header the signature does not cover: it would change the
    request's meaning unchecked (`x-amz-checksum-mode`, `x-amz-content-sha256`)."""
    unsigned = sorted(
        {
            name.lower()
            for name in request.header_names
            if name.lower().startswith("x-amz-") and name.lower() not in signed
        }
    )
    if unsigned:
        raise SignatureRefused(
            "AccessDenied",
            "There were headers present in the request which were not signed",
            fields={"HeadersNotSigned": ", ".join(unsigned)},
        )


def _check_payload_hash(value: str) -> None:
    """A read's body is never read, so a hash given is the empty body's (or UNSIGNED)."""
    if value == UNSIGNED_PAYLOAD:
        return
    if not _HEX64.fullmatch(value):
        raise SignatureRefused(
            "InvalidArgument",
            "x-amz-content-sha256 must be UNSIGNED-PAYLOAD or a valid sha256 value.",
            400,
        )
    if value != EMPTY_SHA256:
        raise SignatureRefused(
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
            400,
        )


def _check_skew(amz_date: str, moment: float, now: float) -> None:
    if abs(moment - now) > MAX_SKEW_S:
        raise SignatureRefused(
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
            fields={
                "RequestTime": amz_date,
                "ServerTime": _iso(now),
                "MaxAllowedSkewMilliseconds": str(MAX_SKEW_S * 1000),
            },
        )


def _parse_time(amz_date: str) -> float | None:
    """Seconds since the epoch of an `x-amz-date` (`20260101T120000Z`); None if it is not one."""
    if len(amz_date) != 16 or not amz_date.isascii():
        return None
    try:
        moment = datetime.datetime.strptime(amz_date, _AMZ_DATE)
    except ValueError:
        return None
    return moment.replace(tzinfo=datetime.UTC).timestamp()


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
