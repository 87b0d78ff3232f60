"""`catalog.list_page`: one origin's entries by glob, in pages bounded by the rows scanned, over
a real store in a temp dir (no sockets)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from shardcache.cache import catalog
from shardcache.cache.entry import EntryMeta
from shardcache.cache.plans import PlanBook
from shardcache.cache.store import Store
from shardcache.errors import BadRequest


class QuotingOrigin:
    """Cache keys as an HTTP origin makes them: the key percent-encoded into the URL."""

    def __init__(self, name: str, base: str) -> None:
        self.name, self.base = name, base

    def url_for(self, key: str) -> str:
        return self.base + quote(key, safe="/")


class SuffixOrigin(QuotingOrigin):
    """Cache keys as an S3 origin with its own endpoint makes them: a suffix after the key."""

    def url_for(self, key: str) -> str:
        return f"{self.base}{key}?endpoint=http://127.0.0.1:9"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "cache", 64 << 20)
    yield opened
    assert opened.check() == []
    opened.close()


def _put(store: Store, url: str, size: int = 10) -> None:
    reservation = store.reserve(size)
    os.pwrite(reservation.fd, b"x" * size, 0)
    store.commit(reservation, url, EntryMeta(size, verified_by=["length", "Content-MD5"]))
    os.close(reservation.fd)


def _all_pages(store: Store, origin: object, pattern: str, limit: int) -> list[catalog.Page]:
    pages, after = [], ""
    while True:
        page = catalog.list_page(store, origin, pattern, after, limit)  # type: ignore[arg-type]
        pages.append(page)
        if page.next is None:
            return pages
        after = page.next


def test_pages_are_bounded_by_rows_scanned_and_cover_every_match_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    web = QuotingOrigin("web", "http://h/data/")
    other = QuotingOrigin("other", "http://h/elsewhere/")
    for n in range(30):
        _put(store, web.url_for(f"train/{n:03d} shard.tar"), 10 + n)
        _put(store, web.url_for(f"val/{n:03d}.tar"))
        _put(store, other.url_for(f"train/{n:03d} shard.tar"))
    monkeypatch.setattr(catalog, "SCAN_ROWS", 7)

    pages = _all_pages(store, web, "train/*[02468] shard.tar", limit=4)
    keys = [entry.key for page in pages for entry in page.entries]
    assert keys == [f"train/{n:03d} shard.tar" for n in range(0, 30, 2)]  # decoded, in order
    assert all(page.scanned <= 7 and len(page.entries) <= 4 for page in pages)
    first = pages[0].entries[0]
    assert (first.size_bytes, first.verified_by, first.pinned_by) == (
        10,
        ("length", "Content-MD5"),
        (),
    )
    assert first.cache_key == "http://h/data/train/000%20shard.tar"
    # A literal prefix narrows the scan to its range of the index: no val/ row is read.
    assert sum(page.scanned for page in pages) <= 30 + 7

    everything = _all_pages(store, web, "*", limit=1000)
    assert len([e for page in everything for e in page.entries]) == 60


def test_an_origin_with_a_suffix_lists_its_own_entries_and_pins_show(tmp_path: Path) -> None:
    store = Store(tmp_path / "cache", 64 << 20, plans=PlanBook())
    s3 = SuffixOrigin("lake", "s3://bucket/")
    plain = QuotingOrigin("plain", "s3://bucket/")
    for key in ("a.tar", "b.tar", "c.tar"):
        _put(store, s3.url_for(key))
    _put(store, plain.url_for("d.tar"))
    store.pin(s3.url_for("b.tar"))
    store.plans.post("job-1", 0, [s3.url_for("c.tar")])  # type: ignore[union-attr]

    listed = catalog.list_page(store, s3, "*")  # type: ignore[arg-type]
    assert [(e.key, e.pinned_by) for e in listed.entries] == [
        ("a.tar", ()),
        ("b.tar", ("look-ahead",)),
        ("c.tar", ("plan",)),
    ]
    assert listed.next is None
    exact = catalog.list_page(store, s3, "a.tar")  # type: ignore[arg-type]
    assert [e.key for e in exact.entries] == ["a.tar"]
    assert store.check() == []
    store.close()


@pytest.mark.parametrize(
    "pattern", ["", "x" * (catalog.MAX_PATTERN_CHARS + 1), "a\x00b", "tab\there", "\n"]
)
def test_unusable_patterns_are_bad_requests(store: Store, pattern: str) -> None:
    with pytest.raises(BadRequest):
        catalog.list_page(store, QuotingOrigin("web", "http://h/"), pattern)  # type: ignore[arg-type]


def test_a_long_glob_of_stars_over_long_keys_finishes(store: Store) -> None:
    web = QuotingOrigin("web", "http://h/")
    for n in range(50):
        _put(store, web.url_for("a" * 900 + str(n)))
    pattern = "*a" * 500 + "*b"  # a backtracking matcher would take forever here
    assert catalog.list_page(store, web, pattern[:1024]).entries == []  # type: ignore[arg-type]


def test_matching_keys_picks_an_origins_keys_by_glob() -> None:
    """The keys of fills in flight (not in the index) that a bulk purge reaches."""
    web = QuotingOrigin("web", "http://h/data/")
    other = QuotingOrigin("other", "http://h/data-2/")
    s3 = SuffixOrigin("s3", "s3://bucket/")
    in_flight = [
        web.url_for("a b/1.tar"),
        web.url_for("a b/2.tar"),
        web.url_for("c/1.tar"),
        other.url_for("a b/3.tar"),  # another origin, sharing the prefix's start
        s3.url_for("a b/4.tar"),
    ]
    assert catalog.matching_keys(web, "a b/*", in_flight) == {
        in_flight[0]: "a b/1.tar",
        in_flight[1]: "a b/2.tar",
    }
    assert catalog.matching_keys(s3, "*", in_flight) == {in_flight[4]: "a b/4.tar"}
    with pytest.raises(BadRequest):
        catalog.matching_keys(web, "", in_flight)
