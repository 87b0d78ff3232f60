"""A fault-injecting reverse proxy in front of the moto S3 server, for soak tests.

The daemon is pointed at the proxy (`AWS_ENDPOINT_URL`); the test's own boto3 calls go to moto
directly. Each request is forwarded (method, path, query, headers including Host and the
signature, body) and moto's answer is sent back. On object GETs and HEADs (a path
`/bucket/key…`) the fault kinds of `tests.fault_origin` are injected and counted in `injected`:

- `get_5xx` / `head_5xx`: an S3 error document with status 500 or 503, moto not asked;
- `reset`, `stall`, `short_body`, `wrong_bytes`: applied to moto's body (`send_body`); moto's
  single-part ETag is the MD5 of the body, so `wrong_bytes` is always detectable;
- `change`: `on_change(bucket, key, seed)` is called (on a worker thread) to put a new version
  into moto, before forwarding, or once the first body chunk is out (the rest of the old body
  is sent after the put, so the daemon's next requests meet the new version);
- `ignore_if_match`: with this probability the request's `If-Match` is stripped before
  forwarding; counted only when moto's answer then carries another ETag (a splice offered);
- `wrong_range`: a 206 for a range starting past 0 replaced by the same number of bytes from
  offset 0, with a Content-Range that says so;
- `rewrite_headers[key]`: headers set on every 200/206 HEAD and GET answer for `key` (a store
  that publishes a checksum it cannot back).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from tests.app_thread import AppThread
from tests.fault_origin import FaultInjector, Faults, reset, send_body

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>{code}</Code><Message>injected failure</Message></Error>"
)


class S3FaultProxy:
    def __init__(
        self,
        upstream: str,
        faults: Faults,
        seed: int = 0,
        on_change: Callable[[str, str, int], None] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.injector = FaultInjector(faults, seed)
        self.on_change = on_change
        self.requests: Counter[str] = Counter()  # object requests by method
        self.gets: Counter[str] = Counter()  # object GETs by bucket/key
        self.heads: Counter[str] = Counter()  # object HEADs by bucket/key and query
        self.get_bytes: Counter[str] = Counter()  # body bytes the store sent, by bucket/key
        # A lying store: key → headers set on its HEAD and GET answers (200/206) as given.
        self.rewrite_headers: dict[str, dict[str, str]] = {}
        self.port = 0

    @property
    def faults(self) -> Faults:
        return self.injector.faults

    @property
    def injected(self) -> Counter[str]:
        return self.injector.injected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _change(self, bucket: str, key: str) -> None:
        if self.on_change is None:
            return
        try:
            await asyncio.to_thread(self.on_change, bucket, key, self.injector.rng.getrandbits(64))
        except Exception as exc:  # a harness problem: make it show in the report
            self.requests[f"change failed: {exc.__class__.__name__}"] += 1

    async def _upstream(
        self, request: web.Request, headers: CIMultiDict[str], data: bytes | None
    ) -> tuple[int, CIMultiDict[str], bytes]:
        async with self._session.request(
            request.method,
            self.upstream + request.raw_path,
            headers=headers,
            data=data,
            allow_redirects=False,
        ) as answer:
            body = await answer.read()
            kept = CIMultiDict(
                (k, v) for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP
            )
            if request.method == "HEAD" and "Content-Length" in answer.headers:
                kept["Content-Length"] = answer.headers["Content-Length"]
            return answer.status, kept, body

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP
        )
        data = await request.read() or None
        bucket, _, key = request.path.lstrip("/").partition("/")
        if not key or request.method not in ("GET", "HEAD"):
            status, answer_headers, body = await self._upstream(request, headers, data)
            return web.Response(status=status, headers=answer_headers, body=body)
        is_head = request.method == "HEAD"
        self.requests[request.method] += 1
        injector = self.injector
        if injector.roll("head_5xx" if is_head else "get_5xx"):
            status = injector.error_status()
            code = "InternalError" if status == 500 else "SlowDown"
            return web.Response(
                status=status,
                body=b"" if is_head else _ERROR_XML.format(code=code).encode(),
                content_type="application/xml",
            )
        change_during = False
        if injector.roll("change"):
            if is_head or injector.rng.random() < 0.5:
                await self._change(bucket, key)
            else:
                change_during = True
        stripped = None
        if "If-Match" in headers:
            self.requests["GET with If-Match"] += 1
        if (
            "If-Match" in headers
            and self.faults.enabled
            and injector.rng.random() < self.faults.ignore_if_match
        ):
            stripped = headers.pop("If-Match")
            self.requests["If-Match stripped"] += 1
        status, answer_headers, body = await self._upstream(request, headers, data)
        if is_head:
            query = f"?{request.query_string}" if request.query_string else ""
            self.heads[f"{bucket}/{key}{query}"] += 1
        else:
            self.gets[f"{bucket}/{key}"] += 1
            self.get_bytes[f"{bucket}/{key}"] += len(body)
        if status in (200, 206):
            answer_headers.update(self.rewrite_headers.get(key, {}))
        if stripped is not None and answer_headers.get("ETag") not in (None, stripped):
            injector.injected["ignore_if_match"] += 1
        if status == 206 and not is_head:
            match = _CONTENT_RANGE.match(answer_headers.get("Content-Range", ""))
            if match is not None and int(match.group(1)) > 0 and injector.roll("wrong_range"):
                length = int(match.group(2)) - int(match.group(1)) + 1
                headers["Range"] = f"bytes=0-{length - 1}"
                status, answer_headers, body = await self._upstream(request, headers, data)
        if is_head or status not in (200, 206):
            response = web.StreamResponse(status=status, headers=answer_headers)
            if is_head and "Content-Length" in answer_headers:
                response.content_length = int(answer_headers["Content-Length"])
            elif not is_head:
                response.content_length = len(body)
            try:
                await response.prepare(request)
                if not is_head:
                    await response.write(body)
                    await response.write_eof()
            except ConnectionError:
                pass
            return response
        fault = injector.body_fault(len(body), may_corrupt=True)
        if fault == "reset" and injector.rng.random() < 0.5:
            reset(request.transport)  # before the headers
            return web.Response(status=500)  # never reaches the client
        response = web.StreamResponse(status=status, headers=answer_headers)
        response.content_length = len(body)
        try:
            await response.prepare(request)
        except ConnectionError:
            return response

        async def change() -> None:  # the rest of this body waits: later requests see it
            await self._change(bucket, key)

        changer = change if change_during else None
        await send_body(request, response, body, fault, injector, self._stopping, changer)
        return response

    def _app(self) -> web.Application:
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)

        async def open_session(app: web.Application) -> None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=64),
                timeout=aiohttp.ClientTimeout(total=60),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )

        async def close_session(app: web.Application) -> None:
            await self._session.close()

        app.on_startup.append(open_session)
        app.on_cleanup.append(close_session)
        return app

    def start(self) -> None:
        self._server = AppThread(self._app, "s3-fault-proxy")
        self._server.start()
        self.port = self._server.port

    def stop(self) -> None:
        """Stop serving; stalled handlers end at once."""
        self._server.call_soon(self._stopping.set)
        self._server.stop()
