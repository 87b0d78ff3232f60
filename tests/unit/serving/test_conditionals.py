"""RFC 9110 §13 preconditions as `serving.conditionals` decides them (pure, no sockets)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from multidict import CIMultiDict

from shardcache.serving.conditionals import (
    FIELD_LIMIT_BYTES,
    Outcome,
    Validators,
    evaluate,
    fields_of,
    http_date,
    is_conditional,
    parse_http_date,
    range_applies,
)

ETAG = '"abc123"'
MODIFIED = 784111777.25  # Sun, 06 Nov 1994 08:49:37 GMT, and a quarter second
AT = "Sun, 06 Nov 1994 08:49:37 GMT"
BEFORE = "Sun, 06 Nov 1994 08:49:36 GMT"
AFTER = "Sun, 06 Nov 1994 08:49:38 GMT"
OBJECT = Validators(ETAG, MODIFIED)

PROCEED, NOT_MODIFIED, FAILED = Outcome.PROCEED, Outcome.NOT_MODIFIED, Outcome.PRECONDITION_FAILED


@pytest.mark.parametrize(
    ("headers", "outcome"),
    [
        ({}, PROCEED),
        # §13.1.1 If-Match: strong comparison, `*`, lists.
        ({"If-Match": ETAG}, PROCEED),
        ({"If-Match": '"nope"'}, FAILED),
        ({"If-Match": '"nope", "abc123"'}, PROCEED),
        ({"If-Match": "*"}, PROCEED),
        ({"If-Match": 'W/"abc123"'}, FAILED),  # a weak tag never matches strongly
        ({"If-Match": "abc123"}, FAILED),  # not an entity-tag: matches nothing
        # §13.1.4 If-Unmodified-Since, at whole seconds.
        ({"If-Unmodified-Since": AT}, PROCEED),
        ({"If-Unmodified-Since": AFTER}, PROCEED),
        ({"If-Unmodified-Since": BEFORE}, FAILED),
        ({"If-Unmodified-Since": "yesterday"}, PROCEED),  # not a date: ignored
        # If-Match wins over If-Unmodified-Since (§13.2.2 step 2 runs only without it).
        ({"If-Match": ETAG, "If-Unmodified-Since": BEFORE}, PROCEED),
        # §13.1.2 If-None-Match: weak comparison, `*`.
        ({"If-None-Match": ETAG}, NOT_MODIFIED),
        ({"If-None-Match": 'W/"abc123"'}, NOT_MODIFIED),
        ({"If-None-Match": '"x", "abc123"'}, NOT_MODIFIED),
        ({"If-None-Match": "*"}, NOT_MODIFIED),
        ({"If-None-Match": '"other"'}, PROCEED),
        # §13.1.3 If-Modified-Since.
        ({"If-Modified-Since": AT}, NOT_MODIFIED),
        ({"If-Modified-Since": AFTER}, NOT_MODIFIED),
        ({"If-Modified-Since": BEFORE}, PROCEED),
        ({"If-Modified-Since": "Sun, 06 Nov 1994 08:49:37 GMT, x"}, PROCEED),  # two members
        # If-None-Match decides alone: If-Modified-Since is then ignored (step 4).
        ({"If-None-Match": '"other"', "If-Modified-Since": AFTER}, PROCEED),
        ({"If-None-Match": ETAG, "If-Modified-Since": BEFORE}, NOT_MODIFIED),
        # A 412 comes before a 304 (steps 1-2 before 3-4).
        ({"If-Match": '"nope"', "If-None-Match": ETAG}, FAILED),
        ({"If-Unmodified-Since": BEFORE, "If-Modified-Since": AFTER}, FAILED),
    ],
)
def test_preconditions_in_the_order_of_section_13_2_2(
    headers: dict[str, str], outcome: Outcome
) -> None:
    assert evaluate(headers, OBJECT) is outcome


def test_dates_mean_nothing_without_a_last_modified() -> None:
    unknown = Validators(ETAG, None)
    assert evaluate({"If-Modified-Since": AFTER}, unknown) is PROCEED
    assert evaluate({"If-Unmodified-Since": BEFORE}, unknown) is PROCEED


def test_tags_match_nothing_without_an_etag() -> None:
    untagged = Validators(None, MODIFIED)
    assert evaluate({"If-Match": ETAG}, untagged) is FAILED
    assert evaluate({"If-Match": "*"}, untagged) is PROCEED  # the object exists
    assert evaluate({"If-None-Match": ETAG}, untagged) is PROCEED


def test_a_weak_current_etag_passes_only_weak_comparison() -> None:
    weak = Validators('W/"abc123"', None)
    assert evaluate({"If-None-Match": ETAG}, weak) is NOT_MODIFIED
    assert evaluate({"If-Match": ETAG}, weak) is FAILED


@pytest.mark.parametrize(
    ("headers", "applies"),
    [
        ({}, True),
        ({"If-Range": ETAG}, True),
        ({"If-Range": '"deadbeef"'}, False),
        ({"If-Range": 'W/"abc123"'}, False),  # §13.1.5: a weak tag never matches
        ({"If-Range": AT}, True),  # exactly Last-Modified
        ({"If-Range": AFTER}, False),  # a later date is not a match
        ({"If-Range": BEFORE}, False),
        ({"If-Range": "garbage"}, False),
    ],
)
def test_if_range(headers: dict[str, str], applies: bool) -> None:
    assert range_applies(headers, OBJECT) is applies


def test_if_range_date_needs_a_last_modified() -> None:
    assert not range_applies({"If-Range": AT}, Validators(ETAG, None))


def test_http_dates_in_all_three_forms_and_back() -> None:
    whole = int(MODIFIED)
    assert parse_http_date(AT) == whole
    assert parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT") == whole
    assert parse_http_date("Sun Nov  6 08:49:37 1994") == whole
    assert parse_http_date("not a date") is None
    assert parse_http_date("") is None
    assert http_date(MODIFIED) == AT


def test_only_preconditions_make_a_request_conditional() -> None:
    assert not is_conditional({"Range": "bytes=0-9", "If-Range": ETAG})
    assert is_conditional({"If-None-Match": ETAG})
    assert is_conditional({"If-Unmodified-Since": AT})


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        (f", ,{ETAG}", NOT_MODIFIED),  # §5.6.1.2: empty list elements are accepted
        (f'"x" , , {ETAG} ,', NOT_MODIFIED),
        (", ,", PROCEED),  # no member at all: not a valid list, matches nothing
        ('"x",, "y"', PROCEED),
    ],
)
def test_empty_list_elements_are_skipped(value: str, outcome: Outcome) -> None:
    assert evaluate({"If-None-Match": value}, OBJECT) is outcome
    refused = FAILED if outcome is PROCEED else PROCEED
    assert evaluate({"If-Match": value}, OBJECT) is refused


def test_a_field_sent_on_several_lines_is_one_list() -> None:
    """§5.3: the lines of a field are one comma-separated list; a field that takes one value
    (If-Range, the dates) sent on two lines has no valid value."""
    lines = CIMultiDict([("If-None-Match", '"x"'), ("If-None-Match", ETAG)])
    assert evaluate(fields_of(lines), OBJECT) is NOT_MODIFIED
    lines = CIMultiDict([("If-Match", '"nope"'), ("if-match", ETAG)])
    assert evaluate(fields_of(lines), OBJECT) is PROCEED
    lines = CIMultiDict([("If-Modified-Since", AT), ("If-Modified-Since", AT)])
    assert evaluate(fields_of(lines), OBJECT) is PROCEED  # ignored
    for second in (ETAG, '"old"'):
        lines = CIMultiDict([("Range", "bytes=0-9"), ("If-Range", ETAG), ("If-Range", second)])
        assert not range_applies(fields_of(lines), OBJECT)
    assert range_applies(fields_of(CIMultiDict([("If-Range", ETAG)])), OBJECT)
    assert fields_of({"If-Match": ETAG}) == {"If-Match": ETAG}  # a plain mapping as it is


HOSTILE_VALUES = [  # aiohttp refuses a header line over 8190 bytes; each is just under it
    "x" + " " * 8000 + "x",  # a run of whitespace after which no tag starts
    "x" + "\t" * 8000 + "x",
    "x" + ", " * 4000 + "x",
    '"a"' + " " * 8000 + "x",
    ", ".join(f'"t{i}"' for i in range(1200)),  # many tags, none current
    'W/"' * 2700,
    '"' * 8000,
]


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=range(len(HOSTILE_VALUES)))
def test_a_hostile_field_is_parsed_in_linear_time(value: str) -> None:
    """The event loop parses these: a few milliseconds at most, never a scan from every
    position (which took 1.9 s for 8,000 spaces between two letters)."""
    headers = {"If-None-Match": value, "If-Match": value, "If-Range": value}
    took_s = min(_timed(lambda: evaluate(headers, OBJECT)) for _ in range(3))
    took_s += min(_timed(lambda: range_applies(headers, OBJECT)) for _ in range(3))
    assert took_s < 0.05, f"{took_s * 1000:.0f} ms"


def _timed(work: Callable[[], object]) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def test_many_lines_of_a_field_cost_no_more_than_one() -> None:
    """aiohttp takes ~100 lines of 8 KiB each: joined, they would be parsed for half a
    second on the event loop. A field past FIELD_LIMIT_BYTES in all has no valid value:
    If-None-Match matches nothing (the object is sent), If-Match fails (412)."""
    tags = ", ".join(f'"t{i}"' for i in range(1000)) + f", {ETAG}"
    lines = CIMultiDict([("If-None-Match", tags)] * 100 + [("If-Match", tags)] * 100)
    began = time.perf_counter()
    assert evaluate(fields_of(lines), OBJECT) is FAILED
    assert time.perf_counter() - began < 0.05
    lines = CIMultiDict([("If-None-Match", tags)] * 100)
    assert evaluate(fields_of(lines), OBJECT) is PROCEED
    assert len(tags) * 2 + 2 <= FIELD_LIMIT_BYTES  # two full lines are still one list
    lines = CIMultiDict([("If-None-Match", tags)] * 2)
    assert evaluate(fields_of(lines), OBJECT) is NOT_MODIFIED
