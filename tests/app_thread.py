"""An aiohttp app served on a free loopback port from its own thread and event loop.

The test origins and the S3 fault proxy run this way: beside the daemon (its own process) and
the test's own code, without sharing either's loop, and stopped when the test ends.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable

from aiohttp import web

from tests.ports import free_port
from tests.readiness import START_TIMEOUT_S


class AppThread:
    def __init__(
        self,
        make_app: Callable[[], web.Application],
        name: str,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`make_app()` runs on the new thread, so the app's events belong to its loop; with
        `ssl_context`, it serves HTTPS."""
        self._make_app = make_app
        self._name = name
        self._ssl_context = ssl_context
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serve on a free port; return once it listens. Raises AssertionError with the
        thread's error when it fails to start, or when START_TIMEOUT_S passes first."""
        ready = threading.Event()
        failed: list[BaseException] = []
        self.port = free_port()

        def run() -> None:
            loop = self.loop = asyncio.new_event_loop()
            # A test's leftover handlers (a stalled body, a held response) are cancelled at
            # once when it ends: waiting for them to finish only slows the suite.
            runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=0.25)
            try:
                loop.run_until_complete(runner.setup())
                site = web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self._ssl_context)
                loop.run_until_complete(site.start())
            except BaseException as exc:  # handed to start(), which raises it
                failed.append(exc)
                ready.set()
                loop.run_until_complete(runner.cleanup())
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name=self._name)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise AssertionError(f"{self._name} did not listen within {START_TIMEOUT_S:.0f} s")
        if failed:
            self.loop = None
            raise AssertionError(f"{self._name} did not start on {self.url}") from failed[0]

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run `callback` on the app's loop (thread-safe)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        """Stop the loop; handlers still running are cancelled by the runner's cleanup."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(15)
