"""A real headless Chromium for tests, driven through its DevTools protocol over a websocket
(aiohttp's client: no new dependency).

`start_chromium` installs Debian's `chromium` with apt-get when it is missing (and fails the
test loudly when that fails), starts one browser with a fresh profile and the flags this
closed network needs (without the background-networking ones Chromium's own connections are
refused and it stalls), and returns its DevTools port. `Tab` opens a new tab on it and records
every event, so a test can check what the page requested, logged and threw.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest

from tests.readiness import wait_until_ready

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",  # the suite runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # it picks one and writes it to DevToolsActivePort
]


def install_chromium() -> str:
    """Return the browser's path, installing Debian's package first when it is missing."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install chromium with")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"apt-get installed chromium, but {CHROMIUM} is not there")
    return CHROMIUM


class Chromium:
    """One browser process; `stop()` ends it (by its own pid) and waits for it."""

    def __init__(self, profile: Path) -> None:
        binary = install_chromium()
        profile.mkdir(parents=True, exist_ok=True)
        self.log_path = profile.parent / "chromium.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        port_file = profile / "DevToolsActivePort"
        try:
            wait_until_ready(
                "chromium (its DevToolsActivePort)",
                lambda: bool(port_file.exists() and port_file.read_text().strip()),
                process=self.process,
                log=self.log_path,
            )
        except AssertionError:
            self.stop()
            raise
        self.port = int(port_file.read_text().split()[0])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Tab:
    """A new tab on the browser, with its DevTools session: `async with Tab(port) as tab`."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def __aenter__(self) -> Tab:
        self._http = aiohttp.ClientSession()
        devtools = f"http://127.0.0.1:{self._port}/json"
        async with self._http.put(f"{devtools}/new?about:blank") as response:
            self._target = await response.json()
        self._ws = await self._http.ws_connect(self._target["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Network", "Log"):
            await self.send(f"{domain}.enable")
        await self.send("Page.bringToFront")  # a background tab's timers run once a second
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._ws.close()
        async with self._http.get(
            f"http://127.0.0.1:{self._port}/json/close/{self._target['id']}"
        ) as response:
            await response.read()
        await self._http.close()

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self._waiting.pop(data["id"])
                if "error" in data:
                    future.set_exception(AssertionError(f"DevTools: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
            else:
                self.events.append((data["method"], data.get("params", {})))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a DevTools method and return its result."""
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._next_id] = future
        await self._ws.send_json({"id": self._next_id, "method": method, "params": params})
        return await asyncio.wait_for(future, 30)

    async def navigate(self, url: str) -> None:
        """Load `url` and wait for its load event."""
        loaded = len([m for m, _ in self.events if m == "Page.loadEventFired"])
        await self.send("Page.navigate", url=url)
        await self.wait_until(
            lambda: len([m for m, _ in self.events if m == "Page.loadEventFired"]) > loaded
        )

    async def wait_until(self, condition: Any, timeout_s: float = 15) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {condition}")
            await asyncio.sleep(0.05)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JS expression in the page (promises awaited), or AssertionError."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 15) -> Any:
        """Evaluate `expression` until it is truthy; return that value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression} still {value!r} after {timeout_s} s")
            await asyncio.sleep(0.1)

    async def screenshot(self, width: int = 1280, height: int = 1400) -> bytes:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])

    def requested_urls(self) -> list[str]:
        return [p["request"]["url"] for m, p in self.events if m == "Network.requestWillBeSent"]

    def problems(self) -> list[str]:
        """Uncaught exceptions, console errors and browser log errors (CSP refusals among them)."""
        found = []
        for method, params in self.events:
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                found.append(json.dumps(params["args"])[:500])
        return found


def png_size_and_colours(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct pixel values in a sample) of an 8-bit RGB(A) PNG; raises
    AssertionError when `data` is not one."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks = 8, {}
    idat = b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        crc = struct.unpack(">I", data[position + 8 + length : position + 12 + length])[0]
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IDAT":
            idat += body
        chunks[kind] = body
        position += 12 + length
    assert b"IHDR" in chunks and b"IEND" in chunks
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    raw = zlib.decompress(idat)  # filtered rows: enough to tell a blank image from a page
    channels = 3 if colour == 2 else 4
    assert len(raw) == height * (1 + width * channels)
    return width, height, len(set(raw[::997]))
