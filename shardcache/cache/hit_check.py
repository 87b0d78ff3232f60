"""`HitChecker`: a hit's bytes checked against the block digests kept at commit, before its
last byte leaves (the serving side holds it back; `serving.body.send_checked`).

Each block of an entry version is read at most once per `window_s` however many readers send
it (single flight per batch); the price: a block rotting after its check can be served clean
within that window. Entries with a whole-object digest only are checked whole on a first hit."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shardcache.cache.blocks import BLOCK_BYTES, BlockHasher, check_blocks, covering, decode
from shardcache.cache.entry import EntryMeta
from shardcache.cache.verify import expected_checksums
from shardcache.checksums import Checksum, Verifier, cheapest
from shardcache.config.options import default as option_default
from shardcache.errors import IntegrityError

VERIFIED_WINDOW_S: float = option_default("verify_hits_window")  # the table's, not a copy
BATCH_BLOCKS = 8  # blocks per worker-thread hop: 8 MiB of CRC-32C, about 1 ms
MAX_RECORDS = 4096  # entry versions remembered; past it, those with nothing fresh are dropped
_WHOLE = -1  # the in-flight slot of an old entry's whole-object check


@dataclass(slots=True)
class _Version:
    """What is known of one entry version: its block digests (None for an old entry until its
    whole check computed them), when each block was last found sound, the checks running."""

    identity: str
    size_bytes: int
    digests: bytes | None
    checked_at: dict[int, float] = field(default_factory=dict)
    running: dict[int, asyncio.Future[bool | None]] = field(default_factory=dict)


class HitChecker:
    """Checks the blocks a hit sends; one per daemon, used on the event loop."""

    def __init__(
        self,
        window_s: float = VERIFIED_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        batch_blocks: int = BATCH_BLOCKS,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._batch_blocks = batch_blocks
        self._versions: dict[str, _Version] = {}
        self.read_bytes = 0  # hashed in all, for tests and the bound

    @staticmethod
    def can_check(meta: EntryMeta) -> bool:
        """Whether `meta` keeps anything a hit can be checked against."""
        return bool(meta.block_crc32c) or bool(_whole_expected(meta))

    async def check(self, key: str, fd: int, meta: EntryMeta, start: int, end: int) -> int:
        """Check bytes [start, end) of the entry `key` open as `fd`; return the bytes this call
        read. Raises IntegrityError naming the key when they do not match or its block digests
        are unreadable (the version is forgotten: the caller drops the entry), OSError for a
        read error."""
        version = self._version(key, fd, meta)
        since = self._clock() - self.window_s
        read = 0
        if version.digests is None:
            read += await self._check_whole(key, version, fd, meta, since)
        blocks = covering(start, end)
        for first in range(blocks.start, blocks.stop, self._batch_blocks):
            batch = range(first, min(first + self._batch_blocks, blocks.stop))
            read += await self._check_batch(key, version, fd, batch, since)
        return read

    def is_checked(self, key: str, fd: int, meta: EntryMeta, start: int, end: int) -> bool:
        """Whether `check` of these bytes would read nothing: every block they cover was found
        sound within the window and the version's digests are known. A hit that is (a hot
        shard, a small object read again) is sent whole, with no check to wait for."""
        version = self._version(key, fd, meta)
        if version.digests is None:
            return False
        since = self._clock() - self.window_s
        checked_at = version.checked_at
        return all(checked_at.get(b, -1.0) >= since for b in covering(start, end))

    def _version(self, key: str, fd: int, meta: EntryMeta) -> _Version:
        """The record of the version open as `fd`: its file's identity is part of it, so a
        reader still holding a dropped version's file never counts the refetched file's checks
        (the same digests) as its own."""
        stat = os.fstat(fd)
        kept = meta.block_crc32c or f"{meta.size_bytes} {meta.etag} {sorted(meta.digests)}"
        identity = f"{stat.st_dev}:{stat.st_ino} {kept}"
        version = self._versions.get(key)
        if version is None or version.identity != identity:
            try:
                digests = decode(meta.block_crc32c, meta.size_bytes) if meta.block_crc32c else None
            except ValueError as exc:  # its metadata cannot vouch for it: dropped as corrupt
                raise IntegrityError(f"the cached entry {key} is unusable: {exc}") from None
            version = _Version(identity, meta.size_bytes, digests)
            if len(self._versions) >= MAX_RECORDS:
                self._prune()
            self._versions[key] = version
        return version

    def _prune(self) -> None:
        """Drop the versions with nothing checked within the window and nothing running."""
        since = self._clock() - self.window_s
        for key, version in list(self._versions.items()):
            if not version.running and all(at < since for at in version.checked_at.values()):
                del self._versions[key]

    async def _check_batch(
        self, key: str, version: _Version, fd: int, batch: range, since: float
    ) -> int:
        read = 0
        while True:
            todo = [b for b in batch if version.checked_at.get(b, -1.0) < since]
            if not todo:
                return read
            mine = [b for b in todo if b not in version.running]
            theirs = {version.running[b] for b in todo if b in version.running}
            if mine:
                assert version.digests is not None
                digests = version.digests
                work = functools.partial(_blocks_sound, fd, mine, digests, version.size_bytes)
                sound = await self._run(version, mine, work)
                checked = sum(min(BLOCK_BYTES, version.size_bytes - b * BLOCK_BYTES) for b in mine)
                read += checked
                self.read_bytes += checked
                if not sound:
                    self._corrupt(key, version, f"a block of {mine[0]}-{mine[-1]}")
            for future in theirs:
                if await asyncio.shield(future) is False:
                    self._corrupt(key, version, "a block another read checked")

    async def _check_whole(
        self, key: str, version: _Version, fd: int, meta: EntryMeta, since: float
    ) -> int:
        """An old entry: hash it whole against its kept digest, taking its block digests."""
        while version.digests is None:
            running = version.running.get(_WHOLE)
            if running is not None:
                if await asyncio.shield(running) is False:
                    self._corrupt(key, version, "the whole object")
                continue
            learned: list[bytes] = []
            verifier = Verifier(_whole_expected(meta))
            work = functools.partial(_hash_whole, fd, meta.size_bytes, verifier, learned)
            sound = await self._run(version, [_WHOLE], work)
            self.read_bytes += meta.size_bytes
            if not sound:
                self._corrupt(key, version, "the whole object")
            version.digests = learned[0]
            now = self._clock()
            version.checked_at.update((b, now) for b in covering(0, meta.size_bytes))
            return meta.size_bytes
        return 0

    async def _run(
        self, version: _Version, slots: list[int], work: Callable[[], bool]
    ) -> bool | None:
        """Run `work` on a worker thread as the one check of `slots`; readers waiting on them
        get its verdict (True sound, False corrupt, None when it failed or was cancelled: they
        check for themselves)."""
        future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        for slot in slots:
            version.running[slot] = future
        sound: bool | None = None
        try:
            sound = await asyncio.to_thread(work)
        finally:
            for slot in slots:
                if version.running.get(slot) is future:
                    del version.running[slot]
            if sound:
                now = self._clock()
                version.checked_at.update((slot, now) for slot in slots if slot != _WHOLE)
            future.set_result(sound)
        return sound

    def _corrupt(self, key: str, version: _Version, where: str) -> None:
        if self._versions.get(key) is version:
            del self._versions[key]
        raise IntegrityError(f"the cached bytes of {key} do not match their digests ({where})")


def _whole_expected(meta: EntryMeta) -> tuple[Checksum, ...]:
    try:
        return cheapest(expected_checksums(meta))
    except ValueError:  # a digest that is not hex: nothing to check against
        return ()


def _blocks_sound(fd: int, blocks: list[int], digests: bytes, size_bytes: int) -> bool:
    return check_blocks(fd, blocks, digests, size_bytes) is None


def _hash_whole(fd: int, size_bytes: int, verifier: Verifier, learned: list[bytes]) -> bool:
    """Hash the whole file with `verifier` and into blocks; whether it matches (a short file
    does not). When it does, its block digests are appended to `learned`. Blocking."""
    blocks = BlockHasher()
    offset = 0
    while offset < size_bytes:
        data = os.pread(fd, min(BLOCK_BYTES, size_bytes - offset), offset)
        if not data:
            return False
        verifier.update(data)
        blocks.update(data)
        offset += len(data)
    if verifier.mismatches():
        return False
    learned.append(blocks.digests())
    return True
