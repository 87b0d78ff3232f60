"""A real WebDataset loader driving real curl through the daemon, against a real HTTP origin."""

from __future__ import annotations

import tarfile
from pathlib import Path

import webdataset as wds

from shardcache.loader.sample import write_sample_shards
from tests.origin_server import OriginServer


def _direct(paths: list[Path]) -> list[tuple[str, bytes, bytes]]:
    """Samples read straight from the tar files, the way the loader groups them."""
    samples: dict[str, dict[str, bytes]] = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                key, _, extension = member.name.partition(".")
                stream = tar.extractfile(member)
                assert stream is not None
                samples.setdefault(key, {})[extension] = stream.read()
    return [(key, s["txt"], s["bin"]) for key, s in samples.items()]


def _samples(url: str) -> list[tuple[str, bytes, bytes]]:
    dataset = wds.WebDataset(url, shardshuffle=False, empty_check=True)
    return [(s["__key__"], s["txt"], s["bin"]) for s in dataset]


def test_loader_reads_exactly_the_direct_samples_then_all_hits(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    shards = write_sample_shards(tmp_path / "shards", shards=4, samples_per_shard=20)
    for path in shards:
        origin.put(f"train/{path.name}", path.read_bytes())
    daemon = start_daemon({"data": origin.url}, "--readahead", "0")  # plain read-through
    direct = _direct(shards)

    pattern = f"pipe:curl -s -f {daemon.url}/data/train/shards_{{000..003}}.tar"
    first = _samples(pattern)
    second = _samples(pattern)

    assert len(direct) == 80
    assert first == direct and second == direct
    misses = daemon.metric("shardcache_requests_total", origin="data", result="miss")
    assert misses == 4, daemon.log()
    assert daemon.metric("shardcache_requests_total", origin="data", result="hit") == 4
    assert sum(origin.gets.values()) == 4, (origin.gets, daemon.log())
