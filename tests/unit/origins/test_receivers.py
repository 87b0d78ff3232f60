"""The receive path's parts with real processes and sockets, no daemon: the wire's messages,
the pool's size, a receiver that dies or stops reading, and the bytes a landing writes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from shardcache import errors
from shardcache.fetch.segments import Segment
from shardcache.origins import receivers
from shardcache.origins.base import Timeouts
from shardcache.origins.http import HttpTransport
from shardcache.origins.receivers import ReceiverPool, default_size
from shardcache.origins.wire import error_from, error_message, receive, send_message, socket_pair
from tests.unit.origins.test_http_exchanges import RawOrigin, response
from tests.unit.waiting import until


def test_a_message_carries_its_payload_and_descriptor(tmp_path: Path) -> None:
    ours, theirs = socket_pair()
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        send_message(ours, {"op": "land", "id": 7}, b"\0payload\0", fd)
        received = receive(theirs)
        assert received is not None
        message, payload, passed = received
        assert (message, bytes(payload)) == ({"op": "land", "id": 7}, b"\0payload\0")
        assert passed is not None and os.fstat(passed).st_ino == os.fstat(fd).st_ino
        os.close(passed)
        ours.close()
        assert receive(theirs) is None  # the other end closed
    finally:
        os.close(fd)
        theirs.close()


def test_an_error_crosses_as_its_own_class_with_its_attributes() -> None:
    sent = errors.OriginShed("web: booked", 2.5, "throttled", is_local=True)
    rebuilt = error_from(error_message(3, sent))
    assert type(rebuilt) is errors.OriginShed
    assert (str(rebuilt), rebuilt.retry_after_s, rebuilt.status) == ("web: booked", 2.5, 503)
    assert (rebuilt.kind, rebuilt.is_local) == ("throttled", True)
    other = error_from(error_message(3, ZeroDivisionError("boom")))
    assert type(other) is errors.OriginUnavailable and "ZeroDivisionError: boom" in str(other)
    forged = error_from({"op": "error", "class": "SystemExit", "message": "x"})
    assert type(forged) is errors.OriginUnavailable  # only the error tree is rebuilt


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1), ("garbage", None)],
)
def test_the_default_size_follows_the_cgroups_cpu_quota(
    tmp_path: Path, cpu_max: str, expected: int | None
) -> None:
    cores = min(len(os.sched_getaffinity(0)), 16)
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert default_size(path) == (cores if expected is None else min(cores, expected))
    assert default_size(tmp_path / "absent") == cores


def _size(path: Path) -> int:
    """Bytes a receiver wrote into `path` so far (0 before the landing created it)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def _land(transport: HttpTransport, url: str, path: Path, size: int) -> Segment:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        stream = await transport.get(url, url, 0, None, None)
        segment = Segment(0, size)
        try:
            await stream.land(fd, segment, lambda count: None, 3.0)
        finally:
            await stream.aclose()
        return segment
    finally:
        os.close(fd)


async def test_a_body_lands_exact_with_its_crc_through_a_receiver(tmp_path: Path) -> None:
    from shardcache.checksums import crc32c

    body = os.urandom(3 << 20)

    async def answer(method: str, path: str) -> bytes:
        return response(body)

    pool = ReceiverPool(1)
    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(1.0, 5.0), receivers=pool)
        try:
            segment = await _land(transport, origin.url("/a"), tmp_path / "a", len(body))
        finally:
            await transport.aclose()
            pool.kill_all()
    assert (tmp_path / "a").read_bytes() == body
    assert (segment.done_bytes, segment.crc32c) == (len(body), crc32c(body))


async def test_a_receiver_killed_mid_body_fails_the_landing_and_is_replaced(
    tmp_path: Path,
) -> None:
    """Headers and half the body, then nothing: the receiver is SIGKILLed while it waits.
    The landing fails with OriginUnavailable at once (not at the read timeout), the dead one
    is counted and replaced, and the next request is served by the new one."""
    half = asyncio.Event()

    async def answer(method: str, path: str) -> bytes | None:
        if path == "/stall":
            half.set()
            return b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 1000\r\n\r\n' + b"x" * 500
        return response(b"ok")

    pool = ReceiverPool(1)
    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(1.0, 30.0), receivers=pool)
        try:
            landing = asyncio.create_task(
                _land(transport, origin.url("/stall"), tmp_path / "s", 1000)
            )
            await half.wait()
            # the 500 bytes landed; the receiver waits for more
            await until("the first 500 bytes land", lambda: _size(tmp_path / "s") == 500)
            (victim,) = pool.alive()
            os.kill(victim.pid, signal.SIGKILL)
            async with asyncio.timeout(5):
                with pytest.raises(errors.OriginUnavailable, match="died .SIGKILL."):
                    await landing
            assert pool.replaced == 1
            assert (tmp_path / "s").read_bytes() == b"x" * 500  # nothing past what landed
            assert await _land(transport, origin.url("/ok"), tmp_path / "ok", 2)
            assert (tmp_path / "ok").read_bytes() == b"ok"
            assert [r.pid for r in pool.alive()] != [victim.pid]
        finally:
            await transport.aclose()
            pool.kill_all()


async def test_a_cancelled_landing_waits_until_the_receiver_stopped_writing(
    tmp_path: Path,
) -> None:
    """A landing cancelled mid-body returns only once the receiver said it stopped: the fill
    may then close, rename or reuse its file, and no late write of the receiver lands in it."""
    started = asyncio.Event()

    async def answer(method: str, path: str) -> bytes | None:
        started.set()
        return b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 100000\r\n\r\n' + b"y" * 10

    pool = ReceiverPool(1)
    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(1.0, 30.0), receivers=pool)
        try:
            path = tmp_path / "c"
            landing = asyncio.create_task(_land(transport, origin.url("/c"), path, 100000))
            await started.wait()
            await until("the first 10 bytes land", lambda: _size(path) == 10)
            landing.cancel()
            async with asyncio.timeout(5):
                with pytest.raises(asyncio.CancelledError):
                    await landing
            assert pool.in_flight() == 0
            assert path.read_bytes() == b"y" * 10
        finally:
            await transport.aclose()
            pool.kill_all()


def test_start_up_can_wait_for_each_receiver_to_answer_once() -> None:
    """The daemon waits for the receivers' first answer (to the ping `start` sends) before it
    listens: a request sent to one still importing waited for it, past a 1 s read timeout on
    a loaded machine. A reload's new receivers are greeted too."""
    pool = ReceiverPool(2)
    try:
        pool.start()
        assert len(pool.alive()) == 2
        assert pool.wait_started(60) == 0
        assert all(receiver.has_spoken.is_set() for receiver in pool.alive())
        pool.restart(1)
        assert pool.wait_started(60) == 0
        assert [receiver.has_spoken.is_set() for receiver in pool.alive()] == [True]
    finally:
        pool.kill_all()


def test_a_receiver_that_stops_reading_is_killed_not_waited_for() -> None:
    """Sends from the event loop never block: a receiver whose socket is full (SIGSTOPped)
    is killed, and the send fails with OriginUnavailable."""
    pool = ReceiverPool(1)
    try:
        pool.start()
        (receiver,) = pool.alive()
        os.kill(receiver.pid, signal.SIGSTOP)
        with pytest.raises(errors.OriginUnavailable, match="stopped reading"):
            for number in range(1_000_000):
                receiver.send({"op": "forget", "transport": number, "pad": "p" * 4000})
        assert receiver.process.wait(timeout=5) == -signal.SIGKILL
    finally:
        pool.kill_all()


async def test_a_stopped_receiver_is_killed_for_its_silence_and_its_landing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP mid-body (a wedged receiver: its own timeouts cannot run): the heartbeat finds
    it silent, kills it, and the landing fails (to be retried) instead of hanging its fill.
    The silence limit is 1.5 s here (10 s in the daemon)."""
    monkeypatch.setattr(receivers, "SILENCE_LIMIT_S", 1.5)
    started = asyncio.Event()

    async def answer(method: str, path: str) -> bytes | None:
        started.set()
        return b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 100000\r\n\r\n' + b"z" * 10

    pool = ReceiverPool(1)
    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(1.0, 60.0), receivers=pool)
        try:
            landing = asyncio.create_task(
                _land(transport, origin.url("/z"), tmp_path / "z", 100000)
            )
            await started.wait()
            await until("the first 10 bytes land", lambda: _size(tmp_path / "z") == 10)
            (victim,) = pool.alive()
            os.kill(victim.pid, signal.SIGSTOP)
            async with asyncio.timeout(8):  # not the 60 s read timeout
                with pytest.raises(errors.OriginUnavailable, match="SIGKILL"):
                    await landing
            assert pool.replaced == 1 and victim.pid not in [r.pid for r in pool.alive()]
        finally:
            await transport.aclose()
            pool.kill_all()


async def test_huge_non_ascii_headers_fail_their_request_only(tmp_path: Path) -> None:
    """Five headers of 50,000 bytes 0xff: under the header bound in characters, six times
    over it as JSON. The request fails with a clear error; the receiver lives on and serves
    the next request (before, the daemon read a cut message and took the receiver for dead,
    failing every request on it)."""

    async def answer(method: str, path: str) -> bytes | None:
        if path == "/huge":
            junk = b"".join(b"X-Junk-%d: %s\r\n" % (i, b"\xff" * 50_000) for i in range(5))
            return b"HTTP/1.1 200 OK\r\n" + junk + b"Content-Length: 2\r\n\r\nhi"
        return response(b"ok")

    pool = ReceiverPool(1)
    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(1.0, 5.0), receivers=pool)
        try:
            with pytest.raises(errors.OriginUnavailable, match="answer headers too large"):
                await _land(transport, origin.url("/huge"), tmp_path / "h", 2)
            await _land(transport, origin.url("/ok"), tmp_path / "ok", 2)
            assert (tmp_path / "ok").read_bytes() == b"ok"
            assert pool.replaced == 0
        finally:
            await transport.aclose()
            pool.kill_all()


async def test_a_receiver_that_cannot_be_started_fails_the_request_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_process(*args: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(receivers, "ReceiverHandle", no_process)
    pool = ReceiverPool(1)
    transport = HttpTransport(Timeouts(1.0, 5.0), receivers=pool)
    with pytest.raises(errors.OriginUnavailable, match="cannot start one .Too many open files"):
        await transport.head("http://127.0.0.1:9/a", "a")
    await asyncio.sleep(0)  # a turn is given back through the loop (`Share.give_back`)
    assert transport.share.in_use == 0


def test_the_module_keeps_no_pool_of_its_own() -> None:
    """The daemon owns the pool and passes it to every transport; a module-level pool (and a
    transport falling back to it) would be a second owner that tests and `check` share."""
    assert not hasattr(receivers, "receiver_pool") and not hasattr(receivers, "configure")
    assert not any(isinstance(value, ReceiverPool) for value in vars(receivers).values())
    with pytest.raises(TypeError):
        HttpTransport(Timeouts(1.0, 5.0))  # type: ignore[call-arg]
