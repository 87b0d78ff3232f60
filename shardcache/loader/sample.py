"""Generated WebDataset shards for the demo origin and the tests (stdlib only).

Each shard is a tar of samples `NNNNNN.txt` (a caption), `NNNNNN.cls` (a label) and `NNNNNN.bin`
(random payload), deterministic for a given seed so that tests can compare against a direct read.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path

SHARD_PATTERN = "shards_{index:03d}.tar"


def write_shard(path: Path, first_sample: int, samples: int, payload_bytes: int, seed: int) -> None:
    """Write the shard beside `path` and rename it over `path`: a daemon reading the old file
    (another `shardcache demo` serving this directory) reads it whole, never a half-written one."""
    rng = random.Random(seed)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        _write_tar(partial, first_sample, samples, payload_bytes, rng)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _write_tar(
    path: Path, first_sample: int, samples: int, payload_bytes: int, rng: random.Random
) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for number in range(first_sample, first_sample + samples):
            key = f"{number:06d}"
            members = {
                "txt": f"sample {number}: a photo of thing {rng.randrange(1000)}".encode(),
                "cls": str(rng.randrange(10)).encode(),
                "bin": rng.randbytes(payload_bytes),
            }
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))


def write_sample_shards(
    directory: Path, shards: int = 10, samples_per_shard: int = 64, payload_bytes: int = 16384
) -> list[Path]:
    """Write `shards` tar files into `directory` (created) and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(shards):
        path = directory / SHARD_PATTERN.format(index=index)
        write_shard(path, index * samples_per_shard, samples_per_shard, payload_bytes, seed=index)
        paths.append(path)
    return paths
