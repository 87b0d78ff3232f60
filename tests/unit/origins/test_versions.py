"""What proves a resumed answer is the same version, and the speed floor (issue 23, items 1
and 3): pure rules, no sockets."""

from __future__ import annotations

import pytest

from shardcache.checksums import Checksum
from shardcache.errors import OriginTooSlow
from shardcache.origins.base import ObjectInfo, SpeedFloor

MD5 = Checksum("md5", b"\x01" * 16, "Content-MD5")


@pytest.mark.parametrize(
    ("first", "later", "proves"),
    [
        (ObjectInfo(10, '"a"'), ObjectInfo(10, '"a"'), True),
        (ObjectInfo(10, '"a"'), ObjectInfo(10, None), False),  # an upstream that omits it
        (ObjectInfo(10, '"a"'), ObjectInfo(10, '"b"'), False),
        (ObjectInfo(10, '"a"'), ObjectInfo(11, '"a"'), False),
        (ObjectInfo(10, 'W/"a"'), ObjectInfo(10, 'W/"a"'), False),  # weak: proves nothing
        (ObjectInfo(10, None), ObjectInfo(10, None), False),
        (ObjectInfo(10, '"a"', last_modified=1.0), ObjectInfo(10, None), False),
        (ObjectInfo(10, None, (MD5,)), ObjectInfo(10, None, (MD5,)), True),  # same checksum
    ],
)
def test_only_the_same_strong_etag_or_checksum_proves_a_version(
    first: ObjectInfo, later: ObjectInfo, proves: bool
) -> None:
    assert (first.proves_same_version(later) is None) is proves
    # The lenient comparison still refuses what visibly changed.
    if first.size_bytes != later.size_bytes:
        assert first.differs_from(later) is not None


def test_the_speed_floor_fails_a_drip_and_passes_a_slow_but_steady_body() -> None:
    now = [0.0]
    drip = SpeedFloor(1024, 2.0, clock=lambda: now[0])
    with pytest.raises(OriginTooSlow, match="under the floor"):
        for _ in range(10):
            now[0] += 1.5
            drip.passed(1, "drip")
    steady = SpeedFloor(1024, 2.0, clock=lambda: now[0])
    for _ in range(100):
        now[0] += 0.5
        steady.passed(600, "steady")  # 1,200 bytes/s
    off = SpeedFloor(0, 2.0, clock=lambda: now[0])
    now[0] += 100
    off.passed(1, "off")


def test_an_origin_header_with_control_characters_is_not_passed_on() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    from shardcache.origins.responses import info_from

    headers = CIMultiDictProxy(
        CIMultiDict({"Content-Length": "4", "ETag": '"a\x1b[2J"', "Content-Type": "x/\x07y"})
    )
    info = info_from(headers, 200, "http://o/k")
    assert (info.etag, info.content_type) == (None, None)
    clean = CIMultiDictProxy(
        CIMultiDict({"Content-Length": "4", "ETag": '"a"', "Content-Type": "x/y; a=b"})
    )
    assert (info_from(clean, 200, "u").etag, info_from(clean, 200, "u").content_type) == (
        '"a"',
        "x/y; a=b",
    )


@pytest.mark.parametrize("etag", ['""', 'W/""', ' "" '])
def test_an_empty_etag_is_no_etag(etag: str) -> None:
    """SeaweedFS answers `ETag: ""` for every object of a remote-mounted bucket (issue 37): the
    same value for every object and version identifies none of them. Read as no ETag, a mirror
    that sends it is checked by the home's checksum and never resumed against, instead of being
    found to disagree with the home (whose ETag is the MD5) after its whole body was sent."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from shardcache.origins.responses import info_from
    from shardcache.origins.s3 import _info

    headers = {"Content-Length": "4", "ETag": etag, "x-amz-request-id": "1"}
    mirror = info_from(CIMultiDictProxy(CIMultiDict(headers)), 200, "http://seaweedfs/k")
    assert (mirror.etag, mirror.strong_etag, mirror.checksums) == (None, None, ())
    home = ObjectInfo(4, '"0123456789abcdef0123456789abcdef"', (MD5,))
    assert home.differs_from(mirror) is None
    assert mirror.proves_same_version(mirror) is not None  # resumed against: nothing proves it
    assert _info({"ContentLength": 4, "ETag": etag}, ()).etag is None
