"""The online scrub's cost and pace (issue 24): CPU seconds per GB checked, and whether a paced
pass keeps its rate. A real store in a temp dir, the scrub in-process (what the daemon runs).

    python benchmarks/scrub.py                 # 2 GiB of entries; a paced pass over 256 MiB
    python benchmarks/scrub.py --gib 1 --rate 32MiB --paced-mib 128

The page cache is emptied of the entries before each cold run with posix_fadvise(DONTNEED)
(no root needed; `echo 3 > /proc/sys/vm/drop_caches` is refused in most containers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardcache.cache.entry import EntryMeta  # noqa: E402
from shardcache.cache.scrub import Scrubber  # noqa: E402
from shardcache.cache.store import Store  # noqa: E402
from shardcache.checksums import crc32c  # noqa: E402
from shardcache.config import OPTIONS  # noqa: E402
from shardcache.units import format_size, parse_size  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
ENTRY_BYTES = 128 * MiB


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _fill(store: Store, total_bytes: int, prefix: str) -> list[Path]:
    block = os.urandom(16 * MiB)
    for n in range(total_bytes // ENTRY_BYTES):
        reservation = store.reserve(ENTRY_BYTES)
        crc = 0
        for offset in range(0, ENTRY_BYTES, len(block)):
            data = n.to_bytes(8, "big") + block[8:]  # each entry its own bytes and digest
            os.pwrite(reservation.fd, data, offset)
            crc = crc32c(data, crc)
        meta = EntryMeta(ENTRY_BYTES, digests={"crc32c": f"{crc:08x}"}, verified_by=["length"])
        store.commit(reservation, f"{prefix}/{n:05d}.tar", meta)
        os.close(reservation.fd)
    return [entry.path for entry in store.walks.entries_after(0, 1 << 20)]


def _drop_page_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def _full_speed(store: Store) -> tuple[int, float, float]:
    scrubber = Scrubber(store, 0)
    try:
        cpu, wall = _cpu_s(), time.monotonic()
        tally, _ = scrubber.verify_now()
        while tally.finished_at is None:
            await asyncio.sleep(0.01)
        return tally.checked_bytes, _cpu_s() - cpu, time.monotonic() - wall
    finally:
        await scrubber.aclose()


async def _paced(store: Store, rate: int) -> tuple[int, float, float]:
    scrubber = Scrubber(store, rate)
    try:
        cpu = _cpu_s()
        scrubber.start()
        while scrubber.stats.passes < 1:
            await asyncio.sleep(0.05)
        assert scrubber.stats.last_full_pass_s is not None
        return scrubber.stats.checked_bytes, _cpu_s() - cpu, scrubber.stats.last_full_pass_s
    finally:
        await scrubber.aclose()


def main() -> int:
    default_rate = next(o.default for o in OPTIONS if o.name == "scrub_rate")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="entries to scrub at full speed")
    parser.add_argument("--rate", default=default_rate, help="the paced pass's --scrub-rate")
    parser.add_argument("--paced-mib", type=int, default=256, help="the paced pass's entries")
    parser.add_argument("--dir", default=None, help="where to put the cache (default: a temp dir)")
    args = parser.parse_args()
    rate = parse_size(args.rate)
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        store = Store(Path(work) / "full", int((args.gib + 1) * GiB))
        paths = _fill(store, int(args.gib * GiB), "full")
        for label in ("cold", "warm"):
            if label == "cold":
                _drop_page_cache(paths)
            size, cpu, wall = asyncio.run(_full_speed(store))
            print(
                f"full speed, {label} page cache: {format_size(size)} in {wall:.2f} s "
                f"({size / wall / 1e9:.2f} GB/s), CPU {cpu:.2f} s = "
                f"{cpu / (size / 1e9):.3f} CPU s/GB"
            )
        store.close()
        store = Store(Path(work) / "paced", (args.paced_mib + 256) * MiB)
        _drop_page_cache(_fill(store, args.paced_mib * MiB, "paced"))
        size, cpu, wall = asyncio.run(_paced(store, rate))
        store.close()
    expected = size / rate
    print(
        f"paced at {format_size(rate)}/s: {format_size(size)} in {wall:.2f} s (rate bound: "
        f"{expected:.2f} s; measured {size / wall / MiB:.1f} MiB/s), CPU {cpu:.2f} s"
    )
    ten = 10 * GiB / rate
    print(f"worst case to find a flipped byte in 10 GiB at {format_size(rate)}/s: {ten:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
