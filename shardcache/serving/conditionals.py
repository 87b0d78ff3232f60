"""HTTP preconditions for GET and HEAD of an object (RFC 9110 §13), as pure rules.

`evaluate` answers If-Match, If-Unmodified-Since, If-None-Match and If-Modified-Since in the
order of §13.2.2; `range_applies` answers If-Range (§13.1.5). Both take the object's
`Validators` (its ETag and Last-Modified) and the request's headers, and know nothing of the
cache, the origin or aiohttp: the server asks them before it sends a byte.
"""

from __future__ import annotations

import datetime
import email.utils
import enum
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

# RFC 9110 §8.8.3: entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE
# A list member: commas are optional to the regex (an alternation with `$` is 2.5 times
# slower) and adjacent tags are accepted; `_entity_tags` refuses anything else between them.
# §5.6.1.2: a recipient accepts empty list elements (`"a", , "b"`), so commas may repeat.
# Matched only where the previous member ended (`match` at a position): a search from every
# position would try each start of a long run of whitespace, quadratic in the field's length.
_ENTITY_TAG = re.compile(r'[\s,]*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"[\s,]*')
# The headers that make a request conditional apart from If-Range (which only decides
# whether a Range applies, never whether the body is sent).
PRECONDITION_HEADERS = ("If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since")
CONDITIONAL_FIELDS = (*PRECONDITION_HEADERS, "If-Range")
FIELD_LIMIT_BYTES = 16 * 1024  # one field, all its lines together (aiohttp: 8190 a line)


class Outcome(enum.Enum):
    """What the preconditions decide: answer normally, 304 Not Modified, or 412."""

    PROCEED = "proceed"
    NOT_MODIFIED = "not_modified"
    PRECONDITION_FAILED = "precondition_failed"


@dataclass(frozen=True, slots=True)
class Validators:
    """An object's validators as a response would carry them; `last_modified` in seconds
    since the epoch (None when the origin gave none)."""

    etag: str | None
    last_modified: float | None

    @property
    def last_modified_second(self) -> int | None:
        """Last-Modified as the header says it: HTTP-dates have whole seconds."""
        return None if self.last_modified is None else math.floor(self.last_modified)


# (is_weak, opaque): an entity-tag of a request header or of the object.
_EntityTag = tuple[bool, str]


def _entity_tags(value: str) -> list[_EntityTag] | None:
    """The entity-tags of a list header, or None when it is not a valid list (then it
    matches nothing). One anchored match per member, linear in the field's length: a header
    of 8 KiB of tags, or of whitespace, takes about a millisecond."""
    tags: list[_EntityTag] = []
    position = 0
    while position < len(value):
        match = _ENTITY_TAG.match(value, position)
        if match is None:
            return None
        tags.append((match.group(1) is not None, match.group(2)))
        position = match.end()
    return tags or None


def _tag_of(etag: str | None) -> _EntityTag | None:
    tags = _entity_tags(etag) if etag else None
    return tags[0] if tags is not None and len(tags) == 1 else None


def _strong_match(listed: str, etag: str | None) -> bool:
    """§8.8.3.2 strong comparison: both tags strong, same opaque value."""
    current = _tag_of(etag)
    if current is None or current[0]:
        return False
    return (False, current[1]) in (_entity_tags(listed) or [])


def _weak_match(listed: str, etag: str | None) -> bool:
    """§8.8.3.2 weak comparison: the same opaque value, weak or not."""
    current = _tag_of(etag)
    if current is None:
        return False
    return any(opaque == current[1] for _, opaque in _entity_tags(listed) or [])


def parse_http_date(value: str | None) -> int | None:
    """An HTTP-date (§5.6.7: IMF-fixdate, or the obsolete RFC 850 and asctime forms) in
    seconds since the epoch, or None when it is not one (then the header is ignored)."""
    if not value or value.count(",") > 1:
        return None  # a list: more than one member, or not a date at all
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:  # asctime carries no zone: it is GMT by definition
        return int(when.replace(tzinfo=datetime.UTC).timestamp())
    return int(when.timestamp())


@functools.lru_cache(maxsize=4096)
def http_date(seconds: float) -> str:
    """`seconds` since the epoch as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`); kept
    per value, as each hit of an entry sends its `Last-Modified` again."""
    return email.utils.formatdate(math.floor(seconds), usegmt=True)


def fields_of(headers: Mapping[str, str]) -> Mapping[str, str]:
    """The request's conditional fields, each as one value, for `evaluate` and `range_applies`.

    RFC 9110 §5.3: the lines of a field are one comma-separated list, so a client's
    `If-None-Match` on two lines is one list. The lines of a field that takes one value
    (If-Range, the dates) are joined the same way, into no valid value: the dates are then
    ignored and If-Range does not hold (the whole object, never a guess at which version the
    client holds). A field longer than FIELD_LIMIT_BYTES in all has no valid value either
    (If-None-Match matches nothing, If-Match fails): aiohttp takes ~100 lines of 8 KiB, which
    would be parsed for half a second on the event loop. `headers` without several lines per
    name (a plain mapping) is returned as it is."""
    getall = getattr(headers, "getall", None)
    if getall is None:
        return headers
    fields: dict[str, str] = {}
    for name in CONDITIONAL_FIELDS:
        lines = getall(name, ())
        if lines:
            value = ", ".join(lines)
            fields[name] = value if len(value) <= FIELD_LIMIT_BYTES else ""
    return fields


_BARE_TAG = re.compile(r"[\x21\x23-\x2b\x2d-\x7e]+")
_ETAG_FIELDS = ("If-Match", "If-None-Match", "If-Range")


def quoting_bare_etags(fields: Mapping[str, str]) -> Mapping[str, str]:
    """`fields` with each bare entity-tag of If-Match, If-None-Match and If-Range quoted, as
    S3 compares them (quoted or not: the AWS Java SDK v1 sends `If-Match: 3858f6…` bare).
    For S3 clients only: RFC 9110 has no bare tags, and a plain client keeps its strict rule.
    A field with any quote in it, `*`, or a character no ETag holds is left as it is."""
    quoted = dict(fields)
    for name in _ETAG_FIELDS:
        value = fields.get(name)
        if value is None or '"' in value or value.strip() == "*":
            continue
        members = [member.strip() for member in value.split(",") if member.strip()]
        if members and all(_BARE_TAG.fullmatch(member) for member in members):
            quoted[name] = ", ".join(f'"{member}"' for member in members)
    return quoted


def is_conditional(headers: Mapping[str, str]) -> bool:
    """True when `headers` carry a precondition that may turn the answer into a 304 or 412."""
    return any(name in headers for name in PRECONDITION_HEADERS)


def evaluate(headers: Mapping[str, str], validators: Validators) -> Outcome:
    """Evaluate the preconditions of a GET or HEAD of an existing object in the order of
    RFC 9110 §13.2.2. The caller answers a 304 or a 412 instead of the object when told;
    a request whose unconditional answer is not a 2xx (a 404) ignores them (§13.2.1)."""
    last_modified = validators.last_modified_second
    if_match = headers.get("If-Match")
    if if_match is not None:
        # §13.1.1: `*` matches any current representation; otherwise a strong comparison.
        if if_match.strip() != "*" and not _strong_match(if_match, validators.etag):
            return Outcome.PRECONDITION_FAILED
    else:
        # §13.1.4: ignored without a valid date or a Last-Modified to compare with.
        since = parse_http_date(headers.get("If-Unmodified-Since"))
        if since is not None and last_modified is not None and last_modified > since:
            return Outcome.PRECONDITION_FAILED
    if_none_match = headers.get("If-None-Match")
    if if_none_match is not None:
        # §13.1.2: `*` or a weak match means the client has it: 304 for GET and HEAD.
        if if_none_match.strip() == "*" or _weak_match(if_none_match, validators.etag):
            return Outcome.NOT_MODIFIED
        return Outcome.PROCEED
    # §13.1.3: If-Modified-Since only without If-None-Match.
    since = parse_http_date(headers.get("If-Modified-Since"))
    if since is not None and last_modified is not None and last_modified <= since:
        return Outcome.NOT_MODIFIED
    return Outcome.PROCEED


def range_applies(headers: Mapping[str, str], validators: Validators) -> bool:
    """Whether a Range in `headers` is to be honoured, by its If-Range (§13.1.5).

    True without If-Range. An entity-tag must match the ETag strongly; an HTTP-date must
    equal Last-Modified exactly. Anything else (a weak tag, an unknown validator, a value
    that is neither) is false: the whole object is sent with a 200, so a resuming client
    never splices two versions."""
    if_range = headers.get("If-Range")
    if if_range is None:
        return True
    value = if_range.strip()
    if value.startswith(('"', "W/")):
        tag = _tag_of(value)
        return tag is not None and not tag[0] and _strong_match(value, validators.etag)
    date = parse_http_date(value)
    return date is not None and date == validators.last_modified_second
