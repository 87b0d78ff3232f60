"""What a request the hit lane takes looks like (`hit_lane`), read strictly from its head: a
plain GET it may answer (`parse_plain_get`), or a bodiless GET or HEAD it may relay to aiohttp
and read on after (`is_relayable`). Anything this reading is unsure of is aiohttp's to parse."""

from __future__ import annotations

import re

from shardcache.serving.s3_errors import SDK_AGENTS

MAX_HEAD_BYTES = 8192  # a longer head is no plain GET of ours: aiohttp parses it
# The only fields a request the lane answers may carry; any other (Range, a precondition, a
# body's, a tier's) is a question for aiohttp's handler. An S3 client's signature is taken
# unchecked, as on loopback there (a path that needs the token is never the lane's).
PLAIN_FIELDS = frozenset(
    {b"host", b"user-agent", b"accept", b"accept-encoding", b"connection", b"authorization"}
    | {b"range"}
    | {b"x-amz-date", b"x-amz-content-sha256", b"x-amz-security-token", b"x-amz-checksum-mode"}
    | {b"amz-sdk-invocation-id", b"amz-sdk-request", b"x-amz-user-agent"}
)
_TARGET_BYTES = frozenset(range(0x21, 0x7F)) - set(b"%?#\\")  # no escapes, query or fragment
# A control byte other than HTAB, CR and LF (those are judged by where they stand): aiohttp's
# parser refuses a head with one (400), so the lane never answers it.
_CONTROL_BYTE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Fields that give a request a body, an upgrade or an end, which a relayed request must not
# carry (a Content-Length of 0 is let through).
_FRAMING_FIELDS = frozenset({b"transfer-encoding", b"upgrade", b"expect", b"te"})
_TOKEN_BYTES = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


class PlainGet:
    """The fields the lane reads of a request it may answer."""

    __slots__ = ("path", "host", "is_s3", "range")

    def __init__(
        self, path: str, host: str | None, is_s3: bool = False, range_: str | None = None
    ) -> None:
        self.path = path
        self.host = host
        self.is_s3 = is_s3  # an S3 client's (`s3_errors.is_s3_request`): x-amz-request-id
        self.range = range_  # its `Range`, as sent


def parse_plain_get(head: bytes) -> PlainGet | None:
    """`head` (without its blank line) as a plain HTTP/1.1 GET, or None when it is anything
    else, or anything this strict reading is unsure of: aiohttp's parser then has the final say."""
    if _CONTROL_BYTE.search(head) is not None:
        return None
    lines = head.split(b"\r\n")
    request_line = lines[0].split(b" ")
    if len(request_line) != 3 or request_line[0] != b"GET" or request_line[2] != b"HTTP/1.1":
        return None
    target = request_line[1]
    if not target.startswith(b"/") or not _TARGET_BYTES.issuperset(target):
        return None
    if b"//" in target or b"/." in target:  # aiohttp's URL normalizes dot segments
        return None
    host: str | None = None
    range_: str | None = None
    is_s3 = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        name = name.lower()
        if not colon or name not in PLAIN_FIELDS or b"\n" in value or b"\r" in value:
            return None  # obs-fold, an unknown field, or a bare LF
        if name == b"host":
            if host is not None:
                return None
            host = value.strip(b" \t").decode("latin-1")
        elif name == b"range":
            if range_ is not None:
                return None
            range_ = value.strip(b" \t").decode("latin-1")
        elif name == b"user-agent":
            agent = value.decode("latin-1").lower()
            is_s3 = is_s3 or any(sdk in agent for sdk in SDK_AGENTS)
        elif name == b"connection":
            if value.strip(b" \t").lower() != b"keep-alive":
                return None  # `close` is answered with its own field, by aiohttp
        elif name == b"authorization":
            if not value.lstrip(b" \t").startswith((b"AWS4-", b"AWS ")):
                return None  # a token: `admit_request` decides what it stands for
            is_s3 = True
        elif name.startswith(b"x-amz-"):
            is_s3 = True
    return PlainGet(target.decode("ascii"), host, is_s3, range_)


def may_become_plain(start: bytes) -> bool:
    """Whether `start`, a head not yet whole, may still become a GET or HEAD the lane answers
    or relays (else it is aiohttp's to answer now: TLS on the plain port, binary garbage, a
    line ended by a bare LF or CR, whose CRLF CRLF never comes)."""
    if not any(start.startswith(m) or m.startswith(start) for m in (b"GET /", b"HEAD /")):
        return False
    if not start.isascii() or _CONTROL_BYTE.search(start) is not None:
        return False
    lone = start.replace(b"\r\n", b"")
    return b"\n" not in lone and b"\r" not in lone[:-1]  # a last CR may be a CRLF's half


def is_relayable(head: bytes) -> bool:
    """Whether `head` (without its blank line) is one whole bodiless request that aiohttp
    parses exactly as the lane splits it: a GET or HEAD in origin form, HTTP/1.1, CRLF line
    ends only, no body or upgrade fields, kept alive. The lane relays such a request and
    reads on after its response; anything else makes the connection aiohttp's for good."""
    if not head.startswith((b"GET /", b"HEAD /")) or not head.isascii() or b"\0" in head:
        return False
    if head.count(b"\n") != head.count(b"\r\n") or head.count(b"\r") != head.count(b"\r\n"):
        return False  # a bare CR or LF: a parser may split it otherwise
    request_line, *lines = head.split(b"\r\n")
    if not request_line.endswith(b" HTTP/1.1") or request_line.count(b" ") != 2:
        return False
    for line in lines:
        name, colon, value = line.partition(b":")
        name = name.lower()
        if not colon or not name or not _TOKEN_BYTES.issuperset(name):
            return False  # obs-fold, a space before the colon, no name
        if name in _FRAMING_FIELDS:
            return False
        if name == b"content-length" and value.strip(b" \t") != b"0":
            return False
        if name == b"connection" and value.strip(b" \t").lower() != b"keep-alive":
            return False
    return True
