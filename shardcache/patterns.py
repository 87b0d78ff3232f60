"""Brace patterns and numbered shard names (pure).

`expand("shards_{000..099}.tar")` follows WebDataset's expansion (the braceexpand library, which
WebDataset itself uses), so a pattern means the same shards to the loader and to the daemon.
`next_keys("shards_000123.tar", 2)` gives the shards a sequential reader will want next.
"""

from __future__ import annotations

import re

from braceexpand import UnbalancedBracesError, braceexpand  # type: ignore[attr-defined]

from shardcache.errors import InvalidKey

MAX_EXPANSION = 1_000_000
_OF_TOTAL = re.compile(r"(\d+)-of-(\d+)")
_DIGITS = re.compile(r"\d+")


def expand(pattern: str) -> list[str]:
    """Return every string `pattern` denotes (`{000..999}`, `{a,b}`), in order.

    Raises InvalidKey for unbalanced braces or a pattern of more than a million names.
    """
    try:
        names = []
        for name in braceexpand(pattern):
            names.append(name)
            if len(names) > MAX_EXPANSION:
                raise InvalidKey(f"{pattern!r} expands to more than {MAX_EXPANSION} names")
        return names
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
