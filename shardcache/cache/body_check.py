"""`BodyCheck`: what a fill's body is checked against and hashed into before it is committed.

Its parts: the published checksums (`learn`), the in-order pass beside the download with a second
opinion on a mismatch (`run`), and the digests kept with the entry (`keep`, `entry_meta`); a
digest kept always describes the bytes committed. It knows the fill's file descriptor and its
download, not the fill's readers or lifecycle."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable

from shardcache.cache.blocks import DIGEST_BYTES, READ_BYTES, block_count, encode
from shardcache.cache.entry import EntryMeta
from shardcache.checksums import (
    LOCAL_DIGEST,
    Checksum,
    Verifier,
    cheapest,
    composite_part_bytes,
    crc32c,
    crc32c_combine,
    has_storable_digest,
    to_headers,
)
from shardcache.crc_spans import BLOCK_BYTES, Span, crc32c_shift
from shardcache.errors import CacheError, IntegrityError, OriginChanged
from shardcache.fetch.checksum_trust import ChecksumTrust
from shardcache.fetch.second_opinion import SecondOpinion
from shardcache.fetch.segments import OriginRequests, SegmentedDownload
from shardcache.origins.base import ObjectInfo, OriginStream

log = logging.getLogger("shardcache.fill")
HASH_BATCH_BYTES = 8 << 20  # hash the verified prefix in steps this large (fewer thread hops)


class BodyCheck:
    """One fill's checksums and digests. `written()`: the contiguous prefix on disk;
    `until(ready)`: the fill's wait until `ready()` (`Readers.until`); `on_learned()`: the
    checksums are known (`learn`).
    `keeps_block_digests`: take the CRC-32C per block that hits are checked against."""

    def __init__(
        self,
        requests: OriginRequests,
        trust: ChecksumTrust,
        written: Callable[[], int],
        until: Callable[[Callable[[], bool]], Awaitable[None]],
        on_learned: Callable[[], None],
        keeps_block_digests: bool = True,
    ) -> None:
        self._requests = requests
        self._trust = trust
        self._written = written
        self._until = until
        self._on_learned = on_learned
        self._keeps_block_digests = keeps_block_digests
        self.is_learned = False  # `checksums` are the object's (none, maybe): no HEAD to ask
        self.published: tuple[Checksum, ...] = ()  # every usable one: second opinions
        self.checksums: tuple[Checksum, ...] = ()  # what the body is verified against
        self.digests: dict[str, str] = {}  # algorithm → hex of the verified body
        self.block_digests = b""  # CRC-32C per block (`blocks`)
        self._stale_sender: tuple[str, ...] = ()  # the upstream whose copy the HEAD disowned
        # The upstreams (not the home) whose bytes were in a body that failed verification:
        # the cache fetches it again from the next one (`ShardCache`), once.
        self.blamed: tuple[str, ...] = ()

    @property
    def verified_by(self) -> tuple[str, ...]:
        """What the body is checked against: its length and the checksum used."""
        return ("length", *(c.source for c in self.checksums))

    async def learn(
        self, info: ObjectInfo, known_info: ObjectInfo | None = None
    ) -> tuple[Checksum, ...]:
        """The cheapest of the object's usable published checksums (`checksum_trust`), from
        the first response when it was the whole object, else from `known_info` (a
        prefetch's HEAD) when it is the same version, else from a HEAD.

        Raises the HEAD's OriginError once retries ran out (an origin that did not answer
        has not said it publishes no checksum; one that answers 405/501 has: length only),
        OriginChanged when the HEAD describes another version than the first response; when a
        tier member or mirror sent that response (a stale copy: the home's HEAD names another
        version), it counts against it as bytes that failed verification (`blamed`), and the
        cache fetches the object again from the next upstream."""
        found = info.checksums
        if not found and known_info and info.differs_from(known_info) is None:
            found = known_info.checksums
        elif not found:
            try:
                head = await self._requests.head_of(info)
            except OriginChanged as exc:
                if info.sent_by is not None:
                    info.sent_by.bytes_failed(str(exc))
                    self._stale_sender = (info.sent_by.name,)
                raise
            found = head.checksums if head is not None else ()
        self.published = self._trust.usable(self._requests.origin.name, found)
        self.checksums = cheapest(self.published)
        self.is_learned = True
        self._on_learned()
        if not self.checksums:
            log.debug(
                "%s: the origin publishes no checksum; checking the length", self._requests.key
            )
        return self.checksums

    async def run(
        self,
        download: SegmentedDownload,
        first: OriginStream,
        info: ObjectInfo,
        fd: int,
        known_info: ObjectInfo | None = None,
    ) -> None:
        """Run the download while a second task learns the checksums and hashes the
        contiguous prefix, in order, as it grows (hashing releases the GIL). Either task
        failing cancels the other at once; both results are always collected, so no task's
        exception goes unretrieved. A body failing verification counts against the upstreams
        that sent its bytes (`blamed`)."""
        try:
            await self._run_both(download, first, info, fd, known_info)
        except IntegrityError as exc:
            self.blamed = download.blame(str(exc))
            raise
        except OriginChanged:  # a stale mirror's or tier member's copy, caught by the HEAD
            self.blamed = self._stale_sender
            raise

    async def _run_both(
        self,
        download: SegmentedDownload,
        first: OriginStream,
        info: ObjectInfo,
        fd: int,
        known_info: ObjectInfo | None,
    ) -> None:
        downloading = asyncio.create_task(download.run(first))
        hashing = asyncio.create_task(self._verify_in_order(info, fd, known_info))
        pending = {downloading, hashing}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # raises the first failure
        finally:
            for task in (downloading, hashing):
                task.cancel()
            await asyncio.gather(downloading, hashing, return_exceptions=True)
            await first.aclose()  # closed already, unless the download was cancelled unstarted

    async def _verify_in_order(
        self, info: ObjectInfo, fd: int, known_info: ObjectInfo | None
    ) -> None:
        """Hash the contiguous prefix in order with the published checksum as it grows, in
        batches (one thread hop per HASH_BATCH_BYTES, not per chunk)."""
        checksums = await self.learn(info, known_info)
        if not checksums:
            return
        verifier = Verifier(checksums)
        hashed = 0
        while hashed < info.size_bytes:
            batch = min(HASH_BATCH_BYTES, info.size_bytes - hashed)
            await self._until(self._has_written(hashed + batch))
            available = self._written()
            await asyncio.to_thread(hash_from, fd, hashed, available - hashed, verifier)
            hashed = available
        if mismatches := verifier.mismatches():  # a checksum the origin gets wrong, or corruption
            opinion = SecondOpinion(self.published, mismatches, fd, info.size_bytes)
            name, key = self._requests.origin.name, self._requests.key
            verifier = await opinion.judge(self._trust, name, key)
        self.checksums, self.digests = verifier.checksums, verifier.digests()

    def _has_written(self, end: int) -> Callable[[], bool]:
        return lambda: self._written() >= end

    async def keep(self, download: SegmentedDownload, fd: int, size_bytes: int) -> None:
        """The digests kept with the entry, once the body is complete and verified: the
        landings' CRC-32C for `shardcache verify` when no checksum can be rechecked on its
        own (none published, or only a multipart ETag), and (`keeps_block_digests`) the
        CRC-32C per block."""
        whole = download.crc32c()
        if not has_storable_digest(self.checksums):
            self.digests = {**self.digests, LOCAL_DIGEST: f"{whole:08x}"}
        if self._keeps_block_digests:
            self.block_digests = await block_digests(download.spans(), fd, size_bytes, whole)

    def entry_meta(self, info: ObjectInfo) -> EntryMeta:
        """The entry's metadata for the verified body of `info`, with what it was checked
        against and the digests kept (`keep`)."""
        return EntryMeta(
            info.size_bytes,
            info.etag,
            info.content_type,
            to_headers(self.checksums),
            digests=self.digests,
            verified_by=list(self.verified_by),
            last_modified=info.last_modified,
            block_crc32c=encode(self.block_digests),
            part_bytes=composite_part_bytes(self.checksums),
        )


async def block_digests(spans: Iterable[Span], fd: int, size_bytes: int, whole: int) -> bytes:
    """One CRC-32C per block of the `size_bytes` body in `fd`, combined from the landings'
    `spans`; the blocks they do not tile are read back (on a worker thread), and every block
    is when the digests do not combine into `whole`, the landings' CRC-32C of the body."""
    digests, missing = combine_spans(spans, size_bytes)
    if missing:
        await asyncio.to_thread(read_blocks, fd, missing, size_bytes, digests)
    if whole_crc(digests, size_bytes) != whole:
        log.warning("block CRC-32Cs disagree with the body's: every block read back")
        await asyncio.to_thread(
            read_blocks, fd, range(block_count(size_bytes)), size_bytes, digests
        )
    return bytes(digests)


def combine_spans(spans: Iterable[Span], size_bytes: int) -> tuple[bytearray, list[int]]:
    """The digests of the blocks of a `size_bytes` body that `spans` tile exactly (each
    block's spans in order, no gap, no overlap, none past the body's end), and the blocks
    they do not (their digest left zero)."""
    by_block: defaultdict[int, list[Span]] = defaultdict(list)
    for span in spans:
        by_block[span[0] // BLOCK_BYTES].append(span)
    count = block_count(size_bytes)
    digests = bytearray(count * DIGEST_BYTES)
    missing: list[int] = []
    for block in range(count):
        start = block * BLOCK_BYTES
        crc = _tiled(sorted(by_block.get(block, ())), start, min(start + BLOCK_BYTES, size_bytes))
        if crc is None:
            missing.append(block)
        else:
            digests[block * DIGEST_BYTES : (block + 1) * DIGEST_BYTES] = crc.to_bytes(
                DIGEST_BYTES, "big"
            )
    return digests, missing


def _tiled(spans: list[Span], start: int, end: int) -> int | None:
    """The CRC-32C of [start, end) when `spans` (sorted) cover it exactly, else None."""
    crc, at = 0, start
    for offset, length, span_crc in spans:
        if offset != at or length <= 0:
            return None
        crc = span_crc if at == start else crc32c_combine(crc, span_crc, length)
        at += length
    return crc if at == end and spans else None


def whole_crc(digests: bytes | bytearray, size_bytes: int) -> int:
    """The CRC-32C of the body the per-block `digests` describe."""
    crc = 0
    for block in range(block_count(size_bytes)):
        length = min(BLOCK_BYTES, size_bytes - block * BLOCK_BYTES)
        digest = int.from_bytes(digests[block * DIGEST_BYTES : (block + 1) * DIGEST_BYTES])
        crc = crc32c_shift(crc, length) ^ digest
    return crc


def read_blocks(fd: int, blocks: Iterable[int], size_bytes: int, digests: bytearray) -> None:
    """Read each of `blocks` of `fd` back and set its digest. Blocking: call it on a worker
    thread. Raises CacheError when the file is shorter than the body."""
    buffer = memoryview(bytearray(READ_BYTES))
    for block in blocks:
        offset = block * BLOCK_BYTES
        end = min(offset + BLOCK_BYTES, size_bytes)
        crc = 0
        while offset < end:
            got = os.preadv(fd, [buffer[: min(end - offset, READ_BYTES)]], offset)
            if not got:
                raise CacheError("the partial file is shorter than what was written")
            crc = crc32c(buffer[:got], crc)
            offset += got
        digests[block * DIGEST_BYTES : (block + 1) * DIGEST_BYTES] = crc.to_bytes(
            DIGEST_BYTES, "big"
        )


def hash_from(fd: int, offset: int, count: int, verifier: Verifier) -> None:
    """Feed bytes [offset, offset+count) of `fd` to `verifier`, read into one reused
    READ_BYTES buffer (it stays in the CPU's cache between the copy and the hashing).
    Blocking: call it on a worker thread. Raises CacheError when the file is shorter."""
    buffer = memoryview(bytearray(min(count, READ_BYTES)))
    while count:
        got = os.preadv(fd, [buffer[: min(count, READ_BYTES)]], offset)
        if not got:
            raise CacheError("the partial file is shorter than what was written")
        verifier.update(buffer[:got])
        offset += got
        count -= got


__all__ = ["BodyCheck", "block_digests", "combine_spans", "whole_crc"]
