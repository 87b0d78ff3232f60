"""An entry's metadata as the index keeps it (`cache.entry.parse_meta`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shardcache.cache.entry import EntryMeta, parse_meta
from shardcache.errors import CacheError


def test_last_modified_round_trips() -> None:
    meta = EntryMeta(10, '"e"', "application/x-tar", last_modified=1_700_000_000.5)
    assert parse_meta(json.dumps(dataclasses.asdict(meta))) == meta


def test_an_entry_committed_before_last_modified_was_kept_still_loads() -> None:
    old = {
        "size_bytes": 10,
        "etag": '"e"',
        "content_type": None,
        "checksum_headers": {},
        "digests": {},
        "verified_by": ["length"],
    }
    loaded = parse_meta(json.dumps(old))
    assert loaded.last_modified is None and loaded.part_bytes == 0


def test_a_composite_s_part_size_round_trips() -> None:
    published = {"x-amz-checksum-crc32": "AAAAAA==-2", "x-amz-checksum-type": "COMPOSITE"}
    meta = EntryMeta(10, '"e-2"', None, published, part_bytes=8 << 20)
    assert parse_meta(json.dumps(dataclasses.asdict(meta))) == meta


@pytest.mark.parametrize("value", ["8MiB", -1, 1.5, None])
def test_a_part_size_that_is_not_a_count_is_unreadable(value: object) -> None:
    with pytest.raises(CacheError):
        parse_meta(json.dumps({"size_bytes": 10, "part_bytes": value}))


@pytest.mark.parametrize("value", ["yesterday", True, [1]])
def test_a_last_modified_that_is_not_a_number_is_unreadable(value: object) -> None:
    with pytest.raises(CacheError):
        parse_meta(json.dumps({"size_bytes": 10, "last_modified": value}))
