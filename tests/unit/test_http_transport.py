"""The HTTP transport against a real aiohttp server on loopback, in the test's own loop."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from shardcache.origins import Timeouts
from shardcache.origins.http import HttpTransport

BODY = b"x" * (8 << 20)


async def test_a_pooled_connection_is_not_poisoned_by_an_old_read_timeout() -> None:
    """Found by the fault soak: right after a busy minute, requests failed at once with "timed
    out", three retries in a row. aiohttp 3.14 re-arms `sock_read` on a connection already
    back in the keep-alive pool (aio-libs/aiohttp#12953); when it fires, the next request on
    that connection fails immediately. The transport keeps its own read timeouts instead."""

    async def shard(request: web.Request) -> web.Response:
        return web.Response(body=BODY, headers={"ETag": '"e"'})

    app = web.Application()
    app.router.add_get("/{key}", shard)
    server = TestServer(app)
    await server.start_server()
    transport = HttpTransport(Timeouts(connect_s=1.0, read_s=0.2))
    try:
        for _ in range(3):
            stream = await transport.get(str(server.make_url("/a.tar")), "a.tar", 0, None, None)
            received = 0
            async for chunk in stream:  # a slow writer: the transport pauses for backpressure
                received += len(chunk)
                await asyncio.sleep(0.002)
            await stream.aclose()
            assert received == len(BODY)
            await asyncio.sleep(0.4)  # idle in the pool past the read timeout
    finally:
        await transport.aclose()
        await server.close()
