"""The stream bases: a `ChunkStream` lands what its one hook yields; a `StreamWrapper` passes
iterating, landing and closing to its inner stream, through the hooks a subclass overrides."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shardcache.checksums import crc32c
from shardcache.crc_spans import Span
from shardcache.errors import OriginUnavailable
from shardcache.origins.base import Landed, ObjectInfo
from shardcache.origins.streams import ChunkStream, StreamWrapper

BODY = b"abcdef"


@dataclass
class _Spot:
    end: int
    done_bytes: int = 0
    crc32c: int = 0
    spans: list[Span] = field(default_factory=list)

    @property
    def position(self) -> int:
        return self.done_bytes


class _Pieces(ChunkStream):
    """BODY in pieces of two, failing after `fail_after` pieces when set."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.info = ObjectInfo(size_bytes=len(BODY), etag='"e"')
        self.fail_after = fail_after
        self.closed = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        for index in range(0, len(BODY), 2):
            if self.fail_after is not None and index // 2 >= self.fail_after:
                raise OriginUnavailable("reset")
            yield BODY[index : index + 2]

    async def aclose(self) -> None:
        self.closed += 1


class _Counting(StreamWrapper):
    """Counts `ended`, and notes every count its landing passed on."""

    def __init__(self, inner: _Pieces) -> None:
        super().__init__(inner)
        self.ended_calls = 0
        self.passed: list[int] = []
        self.failed: list[BaseException] = []

    def ended(self) -> None:
        self.ended_calls += 1

    @contextlib.contextmanager
    def landing(self, landed: Landed) -> Iterator[Landed]:
        def noted(count: int) -> None:
            self.passed.append(count)
            landed(count)

        try:
            yield noted
        except OriginUnavailable as exc:
            self.failed.append(exc)
            raise


def _land_into(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


async def test_a_chunk_stream_lands_and_yields_what_its_hook_gives(tmp_path: Path) -> None:
    stream = _Pieces()
    assert [chunk async for chunk in stream] == [b"ab", b"cd", b"ef"]
    fd = _land_into(tmp_path / "f")
    spot, counts = _Spot(len(BODY)), []
    try:
        await stream.land(fd, spot, counts.append, read_timeout_s=5.0)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == BODY
    assert (spot.done_bytes, spot.crc32c, sum(counts)) == (len(BODY), crc32c(BODY), len(BODY))


async def test_a_chunk_stream_whose_body_ends_early_fails_its_landing(tmp_path: Path) -> None:
    fd = _land_into(tmp_path / "f")
    try:
        with pytest.raises(OriginUnavailable):
            await _Pieces(fail_after=1).land(fd, _Spot(len(BODY)), lambda count: None, 5.0)
    finally:
        os.close(fd)


async def test_a_wrapper_passes_each_way_through_and_ends_each_time() -> None:
    inner = _Pieces()
    wrapper = _Counting(inner)
    assert wrapper.info is inner.info
    assert [chunk async for chunk in wrapper] == [b"ab", b"cd", b"ef"]
    assert wrapper.ended_calls == 1  # read to its end
    await wrapper.aclose()
    assert (inner.closed, wrapper.ended_calls) == (1, 2)


async def test_a_wrappers_landing_hook_sees_every_count_and_the_failure(tmp_path: Path) -> None:
    fd = _land_into(tmp_path / "f")
    try:
        wrapper = _Counting(_Pieces())
        counts: list[int] = []
        await wrapper.land(fd, _Spot(len(BODY)), counts.append, 5.0)
        assert wrapper.passed == counts == [2, 2, 2]
        assert wrapper.ended_calls == 1
        failing = _Counting(_Pieces(fail_after=2))
        with pytest.raises(OriginUnavailable):
            await failing.land(fd, _Spot(len(BODY)), lambda count: None, 5.0)
        assert (failing.passed, len(failing.failed), failing.ended_calls) == ([2, 2], 1, 1)
    finally:
        os.close(fd)


async def test_a_wrapper_given_info_keeps_it() -> None:
    inner = _Pieces()
    other = ObjectInfo(size_bytes=len(BODY), etag='"other"')
    assert StreamWrapper(inner, other).info is other
