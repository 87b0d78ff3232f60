"""The hit lane's reading of request heads (pure): what it may answer, what it may relay and
read on after, and what is aiohttp's for good. A wrong "yes" here is a request the lane
answers or frames differently from aiohttp's parser, so the cases lean on the edges."""

from __future__ import annotations

import pytest

from shardcache.serving.lane_requests import is_relayable, may_become_plain, parse_plain_get

HOST = b"Host: 127.0.0.1:8470"


def _head(*lines: bytes, request_line: bytes = b"GET /o/k.tar HTTP/1.1") -> bytes:
    return b"\r\n".join((request_line, *lines))


def test_a_plain_get_and_an_s3_sdks_signed_get_are_read() -> None:
    plain = parse_plain_get(_head(HOST, b"User-Agent: curl/8.1", b"Accept: */*"))
    assert plain is not None
    assert (plain.path, plain.host, plain.is_s3, plain.range) == (
        "/o/k.tar",
        "127.0.0.1:8470",
        False,
        None,
    )
    signed = parse_plain_get(
        _head(
            HOST,
            b"Authorization: AWS4-HMAC-SHA256 Credential=a/b, Signature=c",
            b"x-amz-date: 20261129T000000Z",
            b"Range: bytes=0-9",
        )
    )
    assert signed is not None and signed.is_s3 and signed.range == "bytes=0-9"
    agent = parse_plain_get(_head(HOST, b"User-Agent: Boto3/1.35 md/Botocore#1.35"))
    assert agent is not None and agent.is_s3


@pytest.mark.parametrize(
    "head",
    [
        _head(HOST, request_line=b"HEAD /o/k.tar HTTP/1.1"),
        _head(HOST, request_line=b"GET /o/k.tar HTTP/1.0"),
        _head(HOST, request_line=b"GET http://h/o/k.tar HTTP/1.1"),
        _head(HOST, request_line=b"GET /o/k%20.tar HTTP/1.1"),
        _head(HOST, request_line=b"GET /o/k.tar?x=1 HTTP/1.1"),
        _head(HOST, request_line=b"GET /o//k.tar HTTP/1.1"),
        _head(HOST, request_line=b"GET /o/./k.tar HTTP/1.1"),
        _head(HOST, request_line=b"GET  /o/k.tar HTTP/1.1"),
        _head(HOST, HOST),
        _head(HOST, b"Range: bytes=0-1", b"Range: bytes=2-3"),
        _head(HOST, b'If-None-Match: "x"'),
        _head(HOST, b"Authorization: Bearer token"),
        _head(HOST, b"Connection: close"),
        _head(HOST, b"X-Other: 1"),
        _head(HOST, b" folded"),
        _head(HOST, b"User-Agent: a\x01b"),
        _head(HOST, b"Accept: a\nb"),
    ],
)
def test_anything_else_is_not_a_plain_get(head: bytes) -> None:
    assert parse_plain_get(head) is None


@pytest.mark.parametrize(
    ("head", "relayable"),
    [
        (_head(HOST, request_line=b"HEAD /o/k.tar HTTP/1.1"), True),
        (_head(HOST, b'If-None-Match: "x"', b"X-Any: thing"), True),
        (_head(HOST, b"Content-Length: 0"), True),
        (_head(HOST, b"Content-Length: 2"), False),
        (_head(HOST, b"Transfer-Encoding: chunked"), False),
        (_head(HOST, b"Upgrade: websocket"), False),
        (_head(HOST, b"Expect: 100-continue"), False),
        (_head(HOST, b"Connection: close"), False),
        (_head(HOST, b"X-A: b\nX-B: c"), False),  # a bare LF: a parser may split it otherwise
        (_head(HOST, b"X-A: b\rc"), False),
        (_head(HOST, b"Bad Name: x"), False),
        (_head(HOST, request_line=b"POST /_/prefetch HTTP/1.1"), False),
        (_head(HOST, request_line=b"GET /o/k.tar HTTP/1.0"), False),
        (_head(HOST, request_line=b"GET http://h/o/k.tar HTTP/1.1"), False),
    ],
)
def test_only_a_bodiless_request_framed_as_aiohttp_frames_it_is_relayed(
    head: bytes, relayable: bool
) -> None:
    assert is_relayable(head) is relayable


@pytest.mark.parametrize(
    ("start", "may"),
    [
        (b"G", True),
        (b"GET /o/k", True),
        (b"HEAD /o", True),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: h\r\n", True),
        (b"\x16\x03\x01\x00", False),  # TLS on the plain port
        (b"POST /", False),
        (b"GET /o/k.tar HTTP/1.1\nHost: h\n", False),  # bare LFs: aiohttp answers 400 now
    ],
)
def test_a_partial_head_is_waited_for_only_while_it_may_become_the_lanes(
    start: bytes, may: bool
) -> None:
    assert may_become_plain(start) is may
