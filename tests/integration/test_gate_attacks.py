"""Hostile clients against an origin's gate (`fetch.gate`): real daemons, real curl and raw
sockets. A cap on requests at once is never exceeded, whatever the clients do (leave while
waiting, leave mid-body, get killed); a place is never leaked (a later reader is served); every
shed request is a 503 with Retry-After and a JSON body, never a 500 or a 200 cut short."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from tests.daemon_process import Daemon
from tests.integration.helpers import CurlResult, curl, wait_for
from tests.origin_server import Behaviour, OriginServer

KiB = 1 << 10


class PeakOrigin(OriginServer):
    """An origin that sends each GET body slowly (`PACE_S` before each of its 32 KiB pieces)
    and remembers the most bodies it was sending at once: begun, its last byte not yet
    written, its connection not closed by the daemon."""

    PACE_S = 0.05
    peak_sending: int = 0

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
        sending: dict[int, web.Request] = self.__dict__.setdefault("_sending", {})
        sending[id(request)] = request
        self.peak_sending = max(
            self.peak_sending,
            sum(1 for r in sending.values() if r.transport is not None and not r.transport.is_closing()),
        )
        try:
            for position in range(start, stop, 32 * KiB):
                await asyncio.sleep(self.PACE_S)
                piece = data[position : min(stop, position + 32 * KiB)]
                if position + len(piece) >= stop:
                    sending.pop(id(request), None)  # the client has every byte once this is written
                await response.write(piece)
        finally:
            sending.pop(id(request), None)
        await response.write_eof()
        return response


def test_a_cap_on_requests_at_once_holds_against_clients_that_leave_or_die(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`max_requests = 2`, twelve slow objects asked at once by twelve clients: four leave
    after 0.3 s (mid-wait or mid-body), two are killed with SIGKILL, six wait. The origin
    never sends more than two bodies at once; each finished answer is a whole 200 or a 503
    with Retry-After in JSON; then every object is served to a late reader (no place
    leaked)."""
    origin = PeakOrigin()
    origin.start()
    try:
        objects = {f"k{n}.tar": os.urandom(256 * KiB) for n in range(12)}
        for key, data in objects.items():
            origin.put(key, data)
        config = tmp_path / "shardcache.toml"
        config.write_text(f'[origins.a]\nurl = "{origin.url}"\nmax_requests = 2\n')
        daemon = start_daemon(
            {}, "--config", str(config), "--origin-read-timeout", "3", "--readahead", "0"
        )
        results: dict[str, CurlResult] = {}
        keys = sorted(objects)

        def ask(key: str, *args: str) -> None:
            results[key] = curl(f"{daemon.url}/a/{key}", *args)

        threads = [
            threading.Thread(target=ask, args=(key, "--max-time", "0.3" if n < 4 else "60"))
            for n, key in enumerate(keys[:10])
        ]
        killed = [
            subprocess.Popen(["curl", "-s", "-o", "/dev/null", f"{daemon.url}/a/{key}"])
            for key in keys[10:]
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.4)
        for process in killed:
            process.send_signal(signal.SIGKILL)
            process.wait()
        for thread in threads:
            thread.join(90)
        for key, answer in results.items():
            if answer.exit_code == 28:  # the client left
                continue
            if answer.status == 503:
                assert answer.headers.get("retry-after"), (key, answer.headers)
                assert answer.headers.get("content-type", "").startswith("application/json")
                continue
            Path("/tmp/gate_log.txt").write_text(daemon.log())
            assert (answer.exit_code, answer.status) == (0, 200), (key, answer, daemon.log())
            assert hashlib.sha256(answer.body).digest() == hashlib.sha256(objects[key]).digest()
        wait_for("the origin to end its bodies", lambda: origin.sending == 0, 60)
        for key in keys:
            late = curl(f"{daemon.url}/a/{key}", "--max-time", "30")
            assert (late.exit_code, late.status) == (0, 200), (key, late.headers, daemon.log())
            assert late.body == objects[key]
        assert origin.peak_sending <= 2, f"the origin sent {origin.peak_sending} bodies at once"
    finally:
        origin.stop()
