"""A real HTTP origin for tests: an aiohttp app on a loopback port, in its own thread and loop.

It counts requests per key, and can delay, hold a response until released, cut a body short,
change an object's ETag, or publish a wrong checksum, so every failure path can be driven.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from tests.app_thread import AppThread


@dataclass
class Behaviour:
    delay_s: float = 0.0  # before the response headers
    cut_after: int | None = None  # close the connection after this many body bytes…
    cuts: int = 0  # …this many times (then serve normally)
    before_cut: threading.Event | None = None  # wait for this before cutting
    hold: threading.Event | None = None  # hold after the headers until set
    stall_after: int | None = None  # stop sending (keep the connection) after N bytes
    content_md5: bytes | None = None  # publish this Content-MD5 instead of the real one
    chunk_bytes: int = 256 * 1024
    chunk_delay_s: float = 0.0  # pause after each chunk: a slow link
    head_status: int | None = None  # answer every HEAD with this status…
    head_refusals: int | None = None  # …only this many times (None: every time)
    head_retry_after: str | None = None  # with this Retry-After
    wrong_range: bool = False  # answer `Range: bytes=N-…` with bytes from 0, and say so
    overlong: int = 0  # answer ranges chunked (no Content-Length) with this many extra bytes
    no_etag: bool = False  # send no validator at all
    claims_etag: str | None = None  # send this ETag whatever the bytes (a lying mirror)
    ignores_if_match: bool = False  # serve whatever If-Match asks (RFC 9110 says 412)
    no_md5: bool = False  # publish no checksum
    last_modified: str | None = None  # a Last-Modified header to send
    status: int | None = None  # answer every GET with this status (an error)
    redirect_to: str | None = None  # answer every request 302 with this Location
    hang_up: bool = False  # close the connection on every GET without answering


@dataclass
class OriginServer:
    objects: dict[str, bytes] = field(default_factory=dict)
    etags: dict[str, str] = field(default_factory=dict)
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    gets: Counter[str] = field(default_factory=Counter)
    heads: Counter[str] = field(default_factory=Counter)
    not_found: Counter[str] = field(default_factory=Counter)  # requests answered 404, by key
    ranges: list[tuple[str, str]] = field(default_factory=list)
    served: Counter[str] = field(default_factory=Counter)  # body bytes written, per key
    port: int = 0
    # Throttling as S3 does it: above this many requests in the last second, 503 SlowDown.
    slow_down_above_rps: float | None = None
    accepted_at: list[float] = field(default_factory=list)  # monotonic times, when throttling
    refused_at: list[float] = field(default_factory=list)
    _last_second: collections.deque[float] = field(default_factory=collections.deque)
    ssl_context: ssl.SSLContext | None = None  # serve HTTPS (see tests/tls.py)
    sending: int = 0  # GET bodies being sent now (a fill's connection still open)

    def _slow_down(self) -> web.Response | None:
        """503 SlowDown when the last second's requests reached the limit, else None."""
        if self.slow_down_above_rps is None:
            return None
        now = time.monotonic()
        while self._last_second and now - self._last_second[0] > 1.0:
            self._last_second.popleft()
        if len(self._last_second) >= self.slow_down_above_rps:
            self.refused_at.append(now)
            return web.Response(
                status=503,
                text="<Error><Code>SlowDown</Code><Message>Please reduce your request rate."
                "</Message></Error>",
                content_type="application/xml",
            )
        self._last_second.append(now)
        self.accepted_at.append(now)
        return None

    def put(self, key: str, data: bytes, **behaviour: object) -> str:
        self.objects[key] = data
        self.etags[key] = '"' + hashlib.md5(data).hexdigest() + '"'
        self.behaviour[key] = Behaviour(**behaviour)  # type: ignore[arg-type]
        return key

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        if key not in self.objects:
            self.not_found[key] += 1
            return web.Response(status=404, text="no such object")
        if (refusal := self._slow_down()) is not None:
            return refusal
        data, etag, how = self.objects[key], self.etags[key], self.behaviour[key]
        (self.heads if request.method == "HEAD" else self.gets)[key] += 1
        if how.redirect_to is not None:
            return web.Response(status=302, headers={"Location": how.redirect_to})
        if how.hang_up and request.method == "GET":
            assert request.transport is not None
            request.transport.close()  # no answer at all
            return web.Response()
        if how.delay_s:
            await asyncio.sleep(how.delay_s)
        if request.method == "GET" and how.status is not None:
            return web.Response(status=how.status, text="refused")
        if request.method == "HEAD" and how.head_status is not None:
            if how.head_refusals is None or how.head_refusals > 0:
                if how.head_refusals is not None:
                    how.head_refusals -= 1
                hint = {"Retry-After": how.head_retry_after} if how.head_retry_after else {}
                return web.Response(status=how.head_status, text="HEAD failed", headers=hint)
        etag = how.claims_etag or etag
        if_match = request.headers.get("If-Match")
        if if_match is not None and if_match != etag and not how.ignores_if_match:
            return web.Response(status=412)
        start, stop = 0, len(data)
        status = 200
        headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Type": "application/x-tar"}
        if how.no_etag:
            del headers["ETag"]
        if how.last_modified is not None:
            headers["Last-Modified"] = how.last_modified
        if "Range" in request.headers:
            self.ranges.append((key, request.headers["Range"]))
            first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
            if int(first) >= len(data):  # RFC 9110 §15.5.17
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            start = int(first)
            stop = min(len(data), int(last) + 1) if last else len(data)
            if how.wrong_range and start > 0:
                start, stop = 0, stop - start
            status = 206
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        elif not how.no_md5:
            md5 = how.content_md5 or hashlib.md5(data).digest()
            headers["Content-MD5"] = base64.b64encode(md5).decode()
        response = web.StreamResponse(status=status, headers=headers)
        if how.overlong and status == 206:
            response.enable_chunked_encoding()
            data = data[:stop] + b"\xee" * how.overlong + data[stop:]
            stop += how.overlong
        else:
            response.content_length = stop - start
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        if how.hold is not None:
            await asyncio.to_thread(how.hold.wait)
        self.sending += 1
        try:
            return await self._send_body(request, response, key, how, data, start, stop)
        finally:
            self.sending -= 1

    async def _send_body(
        self,
        request: web.Request,
        response: web.StreamResponse,
        key: str,
        how: Behaviour,
        data: bytes,
        start: int,
        stop: int,
    ) -> web.StreamResponse:
        position = start
        cut = how.cut_after if how.cuts > 0 else None
        while position < stop:
            piece = data[position : min(stop, position + how.chunk_bytes)]
            if cut is not None and position + len(piece) > cut:
                await response.write(data[position:cut])
                self.served[key] += cut - position
                how.cuts -= 1
                if how.before_cut is not None:
                    await asyncio.to_thread(how.before_cut.wait, 30)
                assert request.transport is not None
                request.transport.close()  # a mid-body failure
                return response
            if how.stall_after is not None and position >= how.stall_after:
                await asyncio.sleep(3600)
            await response.write(piece)
            self.served[key] += len(piece)
            position += len(piece)
            if how.chunk_delay_s:
                await asyncio.sleep(how.chunk_delay_s)
        await response.write_eof()
        return response

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/{key:.*}", self._handle)
        app.router.add_route("HEAD", "/{key:.*}", self._handle)
        return app

    def start(self) -> None:
        self._server = AppThread(self._app, "test-origin", self.ssl_context)
        self._server.start()
        self.port = self._server.port

    def stop(self) -> None:
        for how in self.behaviour.values():
            if how.hold is not None:
                how.hold.set()
        self._server.stop()
