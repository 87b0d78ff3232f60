"""Brace patterns and numbered shard names (pure): `expand` follows WebDataset's expansion
(braceexpand), so a pattern means the same shards to the loader and the daemon; `count` sizes a
pattern without expanding it, so one past the limit is refused in microseconds; `next_keys`
gives the shards a sequential reader wants next."""

from __future__ import annotations

import re

from braceexpand import (  # type: ignore[attr-defined]
    UnbalancedBracesError,
    alphabet,
    braceexpand,
    char_range_re,
    int_range_re,
)

from shardcache.errors import InvalidKey

MAX_EXPANSION = 100_000  # names one pattern (and one prefetch request) may denote
MAX_PATTERN_CHARS = 4096
MAX_NESTING = 16


def count(pattern: str, limit: int = MAX_EXPANSION) -> int:
    """Return how many names `pattern` denotes, without expanding it; past `limit`, any
    number above it (the count stops growing there). Mirrors braceexpand's grammar.

    Raises InvalidKey for unbalanced braces, a pattern over MAX_PATTERN_CHARS, or braces
    nested deeper than MAX_NESTING.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidKey(f"a pattern of {len(pattern)} characters (at most {MAX_PATTERN_CHARS})")
    return _count_pattern(pattern, limit, 0)


def _count_pattern(pattern: str, limit: int, nesting: int) -> int:
    if nesting > MAX_NESTING:
        raise InvalidKey(f"braces nested deeper than {MAX_NESTING}")
    start = pos = depth = 0
    total = 1
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0:
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                expression = pattern[start + 1 : pos]
                found = _count_expression(expression, limit, nesting + 1)
                if found is None:  # literal braces around a pattern
                    found = _count_pattern(expression, limit, nesting + 1)
                total = min(total * found, limit + 1)
                start = pos + 1
        pos += 1
    if depth != 0:
        raise InvalidKey(f"unbalanced braces in {pattern[:100]!r}")
    return total


def _count_expression(expression: str, limit: int, nesting: int) -> int | None:
    """Names in one `{…}`: a numeric or letter range, a comma list, or None (literal)."""
    if (match := int_range_re.match(expression)) is not None:
        first, last, step = int(match.group(1)), int(match.group(2)), int(match.group(3) or 1)
        # Arithmetic, not len(range(…)): a range past sys.maxsize raises OverflowError.
        return min(abs(last - first) // abs(step or 1) + 1, limit + 1)
    if (match := char_range_re.match(expression)) is not None:
        first, last = alphabet.index(match.group(1)), alphabet.index(match.group(2))
        step = int(match.group(3) or 1) or 1
        if first < last:
            return len(alphabet[first : last + 1 : step])
        return len(alphabet[first : (last or -len(alphabet)) - 1 : -step])
    items, start, pos, depth = [], 0, 0, 0
    while pos < len(expression):
        char = expression[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(expression[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not items:
        return None
    items.append(expression[start:])
    return min(sum(_count_pattern(item, limit, nesting) for item in items), limit + 1)


def literal_chars(pattern: str) -> int:
    """How many characters every name `pattern` denotes has at least: those outside its
    braces (a lower bound, so that a size checked with it never refuses what would fit)."""
    chars = pos = depth = 0
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            chars += depth == 0
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}" and depth:
            depth -= 1
        elif depth == 0:
            chars += 1
        pos += 1
    return chars


_OF_TOTAL = re.compile(r"(\d+)-of-(\d+)")
_DIGITS = re.compile(r"\d+")


def expand(pattern: str) -> list[str]:
    """Return every string `pattern` denotes (`{000..999}`, `{a,b}`), in order.

    Raises InvalidKey for unbalanced braces or a pattern of more than MAX_EXPANSION names,
    counted before anything is expanded.
    """
    if count(pattern) > MAX_EXPANSION:
        raise InvalidKey(f"{pattern[:100]!r} denotes more than {MAX_EXPANSION} names")
    try:
        return list(braceexpand(pattern))
    except UnbalancedBracesError:
        raise InvalidKey(f"unbalanced braces in {pattern!r}") from None


def next_keys(key: str, count: int) -> list[str]:
    """Return up to `count` keys after `key` in its numbering, keeping the zero padding.

    `train-00042-of-01024.tar` counts within `-of-` (and stops before the total); otherwise the
    last run of digits in the file name counts. A name without digits, or a number that would
    outgrow its padding, has no successors.
    """
    directory, slash, name = key.rpartition("/")
    match = _OF_TOTAL.search(name)
    if match is not None:
        start, end, limit = match.start(1), match.end(1), int(match.group(2))
    else:
        runs = list(_DIGITS.finditer(name))
        if not runs:
            return []
        start, end, limit = runs[-1].start(), runs[-1].end(), None
    digits = name[start:end]
    width = len(digits) if digits.startswith("0") else 1
    successors = []
    for number in range(int(digits) + 1, int(digits) + 1 + count):
        text = f"{number:0{width}d}"
        if (limit is not None and number >= limit) or (width > 1 and len(text) > width):
            break
        successors.append(f"{directory}{slash}{name[:start]}{text}{name[end:]}")
    return successors
