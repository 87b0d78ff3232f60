"""A plan post the plans have no room for is refused before its names are expanded: a brace
pattern counts as the keys it stands for (`patterns.count`), not as one name. Before, one
pattern of 100,000 keys passed the check as one, was expanded and indexed (0.5-0.9 s and
+47 MiB a post), and only then refused."""

from __future__ import annotations

import json

import pytest

from shardcache.cache import plans as plans_module
from shardcache.cache.plans import PlanBook, PlanRefused
from shardcache.serving import admin, targets


@pytest.fixture
def full_book(monkeypatch: pytest.MonkeyPatch) -> PlanBook:
    """A book with room for 10 more keys (and plenty of characters)."""
    monkeypatch.setattr(plans_module, "MAX_PLANNED_KEYS", 1000)
    book = PlanBook()
    book.post("other", 0, [f"http://o/{i:04d}.tar" for i in range(990)])
    return book


@pytest.fixture
def no_expanding(monkeypatch: pytest.MonkeyPatch) -> None:
    def expand(pattern: str) -> list[str]:
        raise AssertionError(f"{pattern!r} was expanded")

    monkeypatch.setattr(targets, "expand", expand)


def _body(**fields: object) -> bytes:
    return json.dumps({"job": "new", "epoch": 0, **fields}).encode()


@pytest.mark.usefixtures("no_expanding")
@pytest.mark.parametrize(
    "names",
    [
        {"urls": ["/web/x-{000000..099999}.tar"]},
        {"origin": "web", "keys": ["a-{0..5}.tar", "b-{0..5}.tar"]},  # 12: two over
    ],
)
def test_a_pattern_too_large_for_the_plans_is_refused_unexpanded(
    full_book: PlanBook, names: dict[str, object]
) -> None:
    with pytest.raises(PlanRefused, match="not expanded"):
        admin._parse_plan_body(_body(**names), {"web"}, full_book)


def test_the_characters_are_counted_before_expanding_too(
    monkeypatch: pytest.MonkeyPatch, no_expanding: None
) -> None:
    monkeypatch.setattr(plans_module, "MAX_PLANNED_KEY_CHARS", 100_000)
    book = PlanBook()
    long_name = "x" * 200 + "-{00000..00999}.tar"  # 1,000 keys of over 200 characters
    with pytest.raises(PlanRefused):
        admin._parse_plan_body(_body(urls=[f"/web/{long_name}"]), {"web"}, book)


def test_a_pattern_that_fits_is_expanded(full_book: PlanBook) -> None:
    job, epoch, found = admin._parse_plan_body(
        _body(urls=["/web/x-{0..9}.tar"]), {"web"}, full_book
    )
    assert (job, epoch, len(found)) == ("new", 0, 10)
