"""The `/_/status` document's figures for the status page (pure): what the origins sent beside
what clients were served, throttling, and the Basic credentials the page's browser presents."""

from __future__ import annotations

import base64

from shardcache.observability.status import Snapshot, build_status
from shardcache.serving.access import AccessPolicy


def test_origin_bytes_and_throttling_are_in_the_document_per_origin_and_in_all() -> None:
    snapshot = Snapshot(
        response_bytes={("a", "cache"): 900, ("a", "origin"): 100, ("b", "origin"): 50},
        origin_bytes={"a": 600, "b": 50},  # a cache too small: "a" re-read most of it
        origin_throttled={"b": 3},
        origin_request_limit={"b": 4},
    )
    document = build_status(
        version="x",
        uptime_s=1,
        listen="127.0.0.1:1",
        snapshot=snapshot,
        cache={"size_bytes": 1, "capacity_bytes": 2},
        prefetch={},
        origins={"a": "file:///a", "b": "http://b"},
    )
    assert document["origin_bytes"] == 650
    assert document["bytes"] == {"cache": 900, "origin": 150}
    assert document["origins"]["a"]["origin_bytes"] == 600
    assert (document["origins"]["b"]["throttled"], document["origins"]["b"]["request_limit"]) == (
        3,
        4,
    )
    assert document["origins"]["a"]["throttled"] == 0


def _basic(user_and_password: bytes) -> str:
    return "Basic " + base64.b64encode(user_and_password).decode()


def test_basic_credentials_carry_the_token_only_for_the_status_page_reads() -> None:
    policy = AccessPolicy("s3cret:with:colons")
    right = _basic(b"anyone:s3cret:with:colons")
    assert policy.is_authorized(right, allow_basic=True)
    assert policy.is_authorized(_basic(b":s3cret:with:colons"), allow_basic=True)
    assert not policy.is_authorized(right)  # elsewhere only Bearer
    for wrong in [
        _basic(b"anyone:s3cret"),
        _basic(b"s3cret:with:colons"),  # the token as the user name: no password
        "Basic !!!not-base64",
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),  # not UTF-8
        "Basic",
        "",
    ]:
        assert not policy.is_authorized(wrong, allow_basic=True), wrong
    assert policy.is_authorized("Bearer s3cret:with:colons", allow_basic=True)
    assert AccessPolicy.takes_basic("GET", "/_/") and AccessPolicy.takes_basic("HEAD", "/_/status")
    for method, path in [("POST", "/_/status"), ("GET", "/_/origins"), ("DELETE", "/_/")]:
        assert not AccessPolicy.takes_basic(method, path)
