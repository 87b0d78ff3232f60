"""An attack on `redact`'s query-parameter rule: an object key that merely contains '&' or
'?' followed by a word with 'key', 'auth', 'sig' … and '=' (all legal in S3 keys and
unencoded in a URL path) is not a credential, and a log line must keep it readable."""

from __future__ import annotations

import pytest

from shardcache.observability.logs import redact

KEYS = [
    # Hive-style partitions joined with '&', a common way to name shards by their attributes.
    "clips&keyframes=v2/shard-000017.tar",
    "speech&author=librivox/shard-000003.tar",
    "img&design=flat/shard-000001.tar",
]


@pytest.mark.parametrize("key", KEYS)
def test_an_access_line_keeps_an_object_key_readable(key: str) -> None:
    """The daemon's access line for `GET /train/KEY` (its format, as the log shows it; curl
    sends '&' and '=' in a path unencoded). `TextFormatter.format` redacts
    every line. Found: `…&keyframes=***`, `…&author=***`, `…&design=***`:
    the rest of the key, up to the next space, is masked."""
    line = f"INFO    aiohttp.access: GET /train/{key} 200 miss 1048576 12.000ms"
    assert redact(line) == line
