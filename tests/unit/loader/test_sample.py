"""Sample shards are replaced whole: a second `shardcache demo` (README: "beside a running
daemon") rewrites the same directory while the first daemon may be reading a shard from it."""

from __future__ import annotations

import os
from pathlib import Path

from shardcache.loader.sample import write_sample_shards


def test_rewriting_replaces_each_shard_and_an_open_reader_keeps_the_whole_old_one(
    tmp_path: Path,
) -> None:
    first = write_sample_shards(tmp_path, shards=2)
    with open(first[0], "rb") as reading:
        before = reading.read(100)
        inode = os.fstat(reading.fileno()).st_ino
        write_sample_shards(tmp_path, shards=2)
        assert os.stat(first[0]).st_ino != inode  # a new file took the name
        rest = reading.read()
    assert len(before) + len(rest) == os.path.getsize(first[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards_000.tar", "shards_001.tar"]
