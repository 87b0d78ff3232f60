"""A fault-injecting HTTP origin for soak tests: an aiohttp app on a loopback port, in its own
thread and loop (like `tests.origin_server`), that keeps every version of every object.

Every object has an ETag (the quoted MD5 hex of its current version) and `Accept-Ranges: bytes`;
objects put with `checksummed=True` also publish `Content-MD5` on 200 answers and on HEAD (a 206
carries no whole-object checksum, as with real origins). HEAD, `Range: bytes=a-b`, `bytes=a-` and
`bytes=-n` are served; `If-Match` answers 412 when the ETag differs.

Faults are drawn from a seeded `random.Random`, each kind with its own probability (`Faults`),
and every fault injected is counted by kind in `injected`:

- `get_5xx` / `head_5xx`: a GET / HEAD answered 500 or 503;
- `reset`: the connection reset (RST) before the headers, or part-way through the body;
- `stall`: headers and part of the body, then nothing for `stall_s` (longer than the daemon's read
  timeout), then an abort; a stall ends early when the server stops;
- `short_body`: a Content-Length announced, then a clean close after fewer bytes;
- `wrong_bytes`: some body bytes flipped (checksummed objects only: without a checksum a cache
  cannot tell);
- `change`: the object gets a new version (new random bytes, new ETag, same or another length),
  before the request is answered or while its body is in flight (the response in flight keeps
  serving the version it started with, as S3 does);
- `ignore_if_match`: an `If-Match` that no longer matches is ignored and the new version served
  (the splicing case); counted only when it actually mismatched;
- `wrong_range`: a `Range: bytes=N-…` (N > 0) answered 206 with the bytes from 0, and a
  Content-Range that says so (`bytes 0-…/total`);
- `drop_etag`: an answer without its ETag (with `ignore_if_match`, a resume that cannot prove
  its version: the failover soak's lying upstream);
- `drip`: headers, then the body one byte every 0.3 s (under the daemon's read timeout, far
  under its speed floor) until the client gives up.

`path_prefix` is stripped from request paths: a tier member serves an origin under /NAME/.

`FaultInjector` and `send_body` are shared with `tests.s3_fault_proxy`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import random
import re
import socket
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields

from aiohttp import web

from tests.app_thread import AppThread

FAULT_KINDS = (
    "get_5xx",
    "head_5xx",
    "reset",
    "stall",
    "short_body",
    "wrong_bytes",
    "change",
    "ignore_if_match",
    "wrong_range",
    "drop_etag",
    "drip",
)
_BODY_FAULTS = ("reset", "stall", "short_body", "wrong_bytes", "drip")
DRIP_BYTES = 200  # a drip ends in a reset after this many bytes, if the client is still there
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
CHUNK_BYTES = 128 * 1024
# origin request counter: GETs whose If-Match named another version (`ignore_if_match`'s chance)
STALE_IF_MATCH = "stale If-Match"


@dataclass
class Faults:
    """Per-request probability of each fault kind; `enabled=False` turns them all off."""

    get_5xx: float = 0.0
    head_5xx: float = 0.0
    reset: float = 0.0
    stall: float = 0.0
    short_body: float = 0.0
    wrong_bytes: float = 0.0
    change: float = 0.0
    ignore_if_match: float = 0.0  # given a stale If-Match
    wrong_range: float = 0.0  # given a Range starting past 0
    drop_etag: float = 0.0
    drip: float = 0.0
    stall_s: float = 2.5
    enabled: bool = True

    @classmethod
    def soak(cls) -> Faults:
        """Every kind on, at rates where most requests still succeed after the daemon's retries."""
        return cls(
            get_5xx=0.03,
            head_5xx=0.06,
            reset=0.03,
            stall=0.01,
            short_body=0.03,
            wrong_bytes=0.03,
            change=0.02,
            ignore_if_match=0.5,
            wrong_range=0.05,
        )

    def probabilities(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in FAULT_KINDS}


@dataclass
class FaultInjector:
    """The seeded dice and the tally; used from one event loop thread only."""

    faults: Faults
    seed: int = 0
    injected: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def roll(self, kind: str) -> bool:
        """True (and counted) when fault `kind` is to be injected now."""
        probability = getattr(self.faults, kind)
        if not self.faults.enabled or not probability:
            return False  # no draw: a kind that is off leaves the seeded sequence as it was
        if self.rng.random() < probability:
            self.injected[kind] += 1
            return True
        return False

    def roll_chance(self, kind: str, nth: int) -> bool:
        """`roll` for a fault that only the `nth` occasion of its kind allows: the first is
        always taken when the kind is on (a short soak may have one or two occasions)."""
        if nth == 1 and self.faults.enabled and getattr(self.faults, kind):
            self.injected[kind] += 1
            return True
        return self.roll(kind)

    def body_fault(self, size: int, may_corrupt: bool) -> str | None:
        """At most one body fault for a response of `size` bytes."""
        for kind in _BODY_FAULTS:
            if kind == "wrong_bytes" and not may_corrupt:
                continue
            if size == 0 and kind != "reset":
                continue
            if self.roll(kind):
                return kind
        return None

    def flip(self, body: bytes) -> bytes:
        damaged = bytearray(body)
        for _ in range(self.rng.randint(1, 3)):
            damaged[self.rng.randrange(len(damaged))] ^= self.rng.randint(1, 255)
        return bytes(damaged)

    def error_status(self) -> int:
        return self.rng.choice((500, 503))


async def send_body(
    request: web.Request,
    response: web.StreamResponse,
    body: bytes,
    fault: str | None,
    injector: FaultInjector,
    stopping: asyncio.Event,
    after_first_chunk: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Send `body` on a prepared `response`, with `fault` (from `body_fault`) injected.

    `after_first_chunk`, if given, is awaited once the first chunk is out (a change "during"
    the request). A client that goes away is not an error here.
    """
    transport = request.transport
    if fault == "wrong_bytes":
        body = injector.flip(body)
    if fault == "drip":
        with contextlib.suppress(ConnectionError):
            for position in range(min(len(body), DRIP_BYTES)):
                await response.write(body[position : position + 1])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 0.3)
                if stopping.is_set():
                    break
        reset(transport)
        return
    cut = injector.rng.randrange(len(body)) if fault in ("reset", "stall", "short_body") else None
    stop = len(body) if cut is None else cut
    position = 0
    try:
        while position < stop:
            piece = body[position : min(stop, position + CHUNK_BYTES)]
            await response.write(piece)
            position += len(piece)
            if after_first_chunk is not None:
                await after_first_chunk()
                after_first_chunk = None
        if after_first_chunk is not None:
            await after_first_chunk()
        if fault == "stall":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), injector.faults.stall_s)
            reset(transport)
            return
        if fault == "reset":
            reset(transport)
            return
        if fault == "short_body":
            if transport is not None:
                transport.close()
            return
        await response.write_eof()
    except ConnectionError:
        return  # the client went away (the daemon gave up on a stall, say)


def reset(transport: asyncio.Transport | None) -> None:
    """Abort the connection with a TCP RST (a plain abort() of an idle socket sends a FIN)."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, stop) of a single `bytes=` range, or None when it cannot be satisfied."""
    match = _RANGE.match(header.strip())
    if match is None or not (match.group(1) or match.group(2)):
        return None
    first, last = match.groups()
    if not first:
        suffix = int(last)
        return (max(0, size - suffix), size) if suffix else None
    start = int(first)
    stop = min(size, int(last) + 1) if last else size
    return (start, stop) if start < size and stop > start else None


def etag_of(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


@dataclass
class FaultOrigin:
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    versions: dict[str, list[bytes]] = field(default_factory=dict)  # every version, oldest first
    checksummed: dict[str, bool] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)  # by method
    port: int = 0
    path_prefix: str = ""

    def __post_init__(self) -> None:
        self.injector = FaultInjector(self.faults, self.seed)

    @property
    def injected(self) -> Counter[str]:
        return self.injector.injected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def put(self, key: str, data: bytes, checksummed: bool = True) -> str:
        """Publish `data` as the current version of `key` (a new key or a new version)."""
        self.checksummed.setdefault(key, checksummed)
        self.versions.setdefault(key, []).append(data)
        return key

    def current(self, key: str) -> bytes:
        return self.versions[key][-1]

    def _change(self, key: str) -> None:
        old = self.current(key)
        rng = self.injector.rng
        size = len(old) if rng.random() < 0.5 else rng.randint(len(old) * 3 // 4, len(old) * 5 // 4)
        self.put(key, rng.randbytes(max(1, size)))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"].removeprefix(self.path_prefix)
        if key not in self.versions:
            return web.Response(status=404, text="no such object")
        is_head = request.method == "HEAD"
        self.requests[request.method] += 1
        injector = self.injector
        if injector.roll("head_5xx" if is_head else "get_5xx"):
            return web.Response(status=injector.error_status(), text="injected failure")
        change_during = False
        if injector.roll("change"):
            if is_head or injector.rng.random() < 0.5:
                self._change(key)
            else:
                change_during = True
        data = self.current(key)  # this response's snapshot, whatever happens meanwhile
        etag = etag_of(data)
        if_match = request.headers.get("If-Match")
        if if_match is not None and if_match != etag:
            self.requests[STALE_IF_MATCH] += 1  # the only chance `ignore_if_match` gets
            if not injector.roll_chance("ignore_if_match", self.requests[STALE_IF_MATCH]):
                return web.Response(status=412, text="precondition failed")
        headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Type": "application/x-tar"}
        if injector.roll("drop_etag"):
            del headers["ETag"]
        status, start, stop = 200, 0, len(data)
        wanted = request.headers.get("Range")
        if wanted is not None and not is_head:
            chosen = parse_range(wanted, len(data))
            if chosen is None:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            status, (start, stop) = 206, chosen
            if start > 0 and injector.roll("wrong_range"):
                start, stop = 0, stop - start
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        elif self.checksummed[key]:
            headers["Content-MD5"] = base64.b64encode(hashlib.md5(data).digest()).decode()
        fault = None if is_head else injector.body_fault(stop - start, self.checksummed[key])
        if fault == "reset" and injector.rng.random() < 0.5:
            reset(request.transport)  # before the headers
            return web.Response(status=500)  # never reaches the client
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = stop - start
        try:
            await response.prepare(request)
        except ConnectionError:
            return response
        if is_head:
            return response

        async def change() -> None:
            self._change(key)

        changer = change if change_during else None
        await send_body(
            request, response, data[start:stop], fault, injector, self._stopping, changer
        )
        return response

    def _app(self) -> web.Application:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("GET", "/{key:.*}", self._handle)
        app.router.add_route("HEAD", "/{key:.*}", self._handle)
        return app

    def start(self) -> None:
        self._server = AppThread(self._app, "fault-origin")
        self._server.start()
        self.port = self._server.port

    def stop(self) -> None:
        """Stop serving; stalled handlers end at once."""
        self._server.call_soon(self._stopping.set)
        self._server.stop()
