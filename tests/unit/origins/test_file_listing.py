"""A file origin's directory listed as S3 lists a bucket: key order, delimiters, pages that
resume where they stopped, the budget, and nothing outside the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardcache.errors import BadRequest
from shardcache.origins import file_listing
from shardcache.origins.base import ObjectInfo
from shardcache.origins.file_listing import list_directory
from shardcache.origins.listing import Listing, ListQuery, ListVersion


def _describe(stat: os.stat_result) -> ObjectInfo:
    return ObjectInfo(stat.st_size, '"e"')


def _tree(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * len(name))


def _all(root: Path, **fields: object) -> tuple[list[str], list[str], int]:
    """Every page of a listing: keys, common prefixes, and how many pages it took."""
    keys: list[str] = []
    prefixes: list[str] = []
    token = None
    pages = 0
    while True:
        page: Listing = list_directory(
            str(root),
            ListQuery(ListVersion.V2, token=token, **fields),
            _describe,  # type: ignore[arg-type]
        )
        pages += 1
        keys += [o.key for o in page.objects]
        prefixes += list(page.common_prefixes)
        if not page.is_truncated:
            return keys, prefixes, pages
        token = page.next_token
        assert pages < 1000


# "a-b" sorts before "a/…" ("-" < "/"): a walk that visited directories before files, or
# compared names without the directory's slash, would get this order wrong.
NAMES = ["a-b", "a/x", "a/y/z", "a0", "b/c/d", "b/e", "top.tar"]


def test_keys_come_in_s3s_order_across_pages(tmp_path: Path) -> None:
    _tree(tmp_path, NAMES)
    for max_keys in (1, 2, 3, 1000):
        assert _all(tmp_path, max_keys=max_keys)[0] == sorted(NAMES)


def test_a_delimiter_rolls_keys_up_once_across_pages(tmp_path: Path) -> None:
    _tree(tmp_path, NAMES)
    for max_keys in (1, 2, 1000):
        keys, prefixes, _ = _all(tmp_path, delimiter="/", max_keys=max_keys)
        assert (keys, prefixes) == (["a-b", "a0", "top.tar"], ["a/", "b/"])
    keys, prefixes, _ = _all(tmp_path, prefix="b/", delimiter="/", max_keys=1)
    assert (keys, prefixes) == (["b/e"], ["b/c/"])
    keys, prefixes, _ = _all(tmp_path, prefix="a", delimiter="-")
    assert (keys, prefixes) == (["a/x", "a/y/z", "a0"], ["a-"])


def test_start_after_and_prefix(tmp_path: Path) -> None:
    _tree(tmp_path, NAMES)
    assert _all(tmp_path, start_after="a/x")[0] == ["a/y/z", "a0", "b/c/d", "b/e", "top.tar"]
    assert _all(tmp_path, prefix="b/c")[0] == ["b/c/d"]
    assert _all(tmp_path, prefix="../")[0] == []
    assert _all(tmp_path, prefix="nope/")[0] == []


def test_links_and_what_they_point_at_are_not_listed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    _tree(root, ["in.tar"])
    _tree(outside, ["secret"])
    (root / "out").symlink_to(outside)
    (root / "file-link").symlink_to(outside / "secret")
    assert _all(root)[0] == ["in.tar"]
    assert _all(root, prefix="out/")[0] == []


def test_a_page_stops_at_the_budget_and_the_next_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"d{d}/{n}" for d in range(6) for n in range(3)]
    _tree(tmp_path, names)
    monkeypatch.setattr(file_listing, "SCAN_BUDGET", 4)
    keys, _, pages = _all(tmp_path)
    assert keys == sorted(names) and pages > 1


def test_a_token_of_another_kind_is_refused(tmp_path: Path) -> None:
    for token in ("garbage", "czM6eA=="):  # base64 of "s3:x": an S3 origin's
        with pytest.raises(BadRequest):
            list_directory(str(tmp_path), ListQuery(ListVersion.V2, token=token), _describe)
