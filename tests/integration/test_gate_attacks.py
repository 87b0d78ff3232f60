"""Hostile clients against an origin's gate (`fetch.gate`): real daemons, real curl and raw
sockets. A cap on requests at once is never exceeded, whatever the clients do (leave while
waiting, leave mid-body, get killed); a place is never leaked (a later reader is served); every
shed request is a 503 with Retry-After and a JSON body, never a 500 or a 200 cut short."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import botocore.exceptions
import pytest
from aiohttp import web

from tests.app_thread import AppThread
from tests.daemon_process import Daemon
from tests.integration.helpers import CurlResult, curl, wait_for
from tests.origin_server import Behaviour, OriginServer
from tests.s3_stores import client_for, env_for

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
        open_now = [r for r in sending.values() if r.transport and not r.transport.is_closing()]
        self.peak_sending = max(self.peak_sending, len(open_now))
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


def test_a_client_that_stops_reading_holds_its_place_no_longer_than_the_send_timeout(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`max_requests = 1`, a 1 MiB cache: a 32 MiB object is streamed through, its GET's place
    held while a raw-socket client asks for it and then reads nothing (the GET of its rest,
    after the first segment's). Once the client has
    read nothing for the send timeout (2 s) it is cut off, its fill stopped and the place given
    back: a reader of another object, waiting at the gate meanwhile (read timeout 15 s), is
    served."""
    origin.put("big.tar", os.urandom(32 << 20))
    origin.put("small.tar", small := os.urandom(4 * KiB))
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "{origin.url}"\nmax_requests = 1\n')
    daemon = start_daemon(
        {},
        "--config",
        str(config),
        "--origin-read-timeout",
        "15",
        "--client-send-timeout",
        "2",
        "--readahead",
        "0",
        "--shutdown-grace",
        "1",
        cache_size="1MiB",
    )
    host, port = daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(f"GET /a/big.tar HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        # The first GET (the first segment) ends; the second, of the rest, holds the place.
        wait_for("the rest of the big object asked", lambda: origin.gets["big.tar"] >= 2, 15)
        began = time.monotonic()
        answer = curl(f"{daemon.url}/a/small.tar", "--max-time", "30")
        took_s = time.monotonic() - began
    assert (answer.exit_code, answer.status) == (0, 200), (answer, took_s, daemon.log()[-3000:])
    assert answer.body == small


def test_listings_and_heads_flooding_a_rate_cap_are_shed_as_slow_down_never_a_500(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`max_requests_per_second = 0.5`, read timeout 2 s, a file origin: eight boto3 listings
    and eight HEADs of misses at once. At most a couple fit in the wait; every other one is
    shed before it is sent: S3's 503 SlowDown with Retry-After for the SDK, 503 with
    Retry-After for curl; never a 500."""
    root = tmp_path / "bkt"
    root.mkdir()
    for n in range(8):
        (root / f"k{n}.tar").write_bytes(os.urandom(1024))
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.bkt]\nurl = "file://{root}"\nmax_requests_per_second = 0.5\n')
    daemon = start_daemon(
        {}, "--config", str(config), "--origin-read-timeout", "2", "--readahead", "0"
    )
    client = client_for(daemon.url, retries={"max_attempts": 1})
    outcomes: list[tuple[str, int, str | None]] = []

    def list_once() -> None:
        try:
            client.list_objects_v2(Bucket="bkt")
            outcomes.append(("list", 200, None))
        except botocore.exceptions.ClientError as exc:
            meta = exc.response["ResponseMetadata"]
            code = exc.response["Error"]["Code"]
            hint = meta["HTTPHeaders"].get("retry-after")
            outcomes.append((f"list {code}", meta["HTTPStatusCode"], hint))

    def head_once(n: int) -> None:
        answer = curl(f"{daemon.url}/bkt/k{n}.tar", "-I", "--max-time", "20")
        outcomes.append(("head", answer.status, answer.headers.get("retry-after")))

    threads = [threading.Thread(target=list_once) for _ in range(8)]
    threads += [threading.Thread(target=head_once, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 16, outcomes
    for what, status, retry_after in outcomes:
        assert status in (200, 503), (what, status, daemon.log()[-3000:])
        if status == 503:
            assert retry_after, (what, outcomes)
            assert what in ("head", "list SlowDown"), outcomes
    assert any(status == 503 for _, status, _ in outcomes), outcomes


def test_a_tier_member_that_sheds_as_busy_is_not_marked_down_nor_gone_around(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """A tier member caps the store at `max_requests = 1` (read timeout 1 s); a node reads
    through it. Three clients ask the node for three slow objects at once: the member sends
    one GET and sheds the others (503, kind "busy", Retry-After). The node passes the shed
    on: it neither marks the member down (it answered, at once, as configured) nor asks the
    store itself around the member's cap; the store never sends two bodies at once."""
    origin = PeakOrigin()
    origin.PACE_S = 0.25  # 8 pieces: 2 s a body
    origin.start()
    try:
        for n in range(3):
            origin.put(f"k{n}.tar", os.urandom(256 * KiB))
        member_config = tmp_path / "member.toml"
        member_config.write_text(f'[origins.d]\nurl = "{origin.url}"\nmax_requests = 1\n')
        member = start_daemon(
            {},
            "--config",
            str(member_config),
            "--origin-read-timeout",
            "1",
            "--readahead",
            "0",
            cache_dir=tmp_path / "member",
        )
        node_config = tmp_path / "node.toml"
        node_config.write_text(f'[origins.d]\nurl = "{origin.url}"\ntier = ["{member.url}"]\n')
        node = start_daemon(
            {}, "--config", str(node_config), "--readahead", "0", cache_dir=tmp_path / "node"
        )
        answers: dict[int, CurlResult] = {}

        def ask(n: int) -> None:
            answers[n] = curl(f"{node.url}/d/k{n}.tar", "--max-time", "30")

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        statuses = sorted(a.status for a in answers.values())
        assert statuses[0] == 200, (statuses, node.log()[-3000:])
        for answer in answers.values():
            if answer.status == 503:
                assert answer.headers.get("retry-after"), answer.headers
        assert "is down" not in node.log(), node.log()[-3000:]
        assert origin.peak_sending <= 1, f"the store sent {origin.peak_sending} bodies at once"
    finally:
        origin.stop()


def test_listings_hold_a_place_under_a_cap_on_requests_at_once(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`max_requests = 1` on an S3 origin whose ListObjectsV2 takes 0.5 s to answer: four
    boto3 listings at once. A listing is a GET with a body, and the store must not be sent two
    at once; each listing is answered, or shed with SlowDown."""
    at_once = {"now": 0, "peak": 0}

    async def handle(request: web.Request) -> web.Response:
        at_once["now"] += 1
        at_once["peak"] = max(at_once["peak"], at_once["now"])
        try:
            await asyncio.sleep(0.5)
        finally:
            at_once["now"] -= 1
        listing = (
            b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
            b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>slow</Name>'
            b"<IsTruncated>false</IsTruncated></ListBucketResult>"
        )
        return web.Response(body=listing, content_type="application/xml")

    def make_app() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    store = AppThread(make_app, "slow-listing-s3")
    store.start()
    try:
        config = tmp_path / "shardcache.toml"
        config.write_text('[origins.slow]\nurl = "s3://slow"\nmax_requests = 1\n')
        daemon = start_daemon(
            {},
            "--config",
            str(config),
            "--origin-read-timeout",
            "10",
            "--readahead",
            "0",
            env=env_for(store.url),
        )
        client = client_for(daemon.url, retries={"max_attempts": 1})
        codes: list[str] = []

        def list_once() -> None:
            try:
                client.list_objects_v2(Bucket="slow")
                codes.append("ok")
            except botocore.exceptions.ClientError as exc:
                codes.append(exc.response["Error"]["Code"])

        threads = [threading.Thread(target=list_once) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(codes) == ["ok"] * 4, (codes, daemon.log()[-3000:])
        assert at_once["peak"] <= 1, f"the store was sent {at_once['peak']} listings at once"
    finally:
        store.stop()


def test_hostile_retry_after_values_under_a_rate_cap_give_a_prompt_bounded_503(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """An origin that refuses every GET with 429 or 503 and a hostile Retry-After (huge, a
    date far ahead, negative, garbage), under `max_requests_per_second = 5` and a 2 s read
    timeout: each client gets a 503 within a few seconds, its Retry-After a whole number of
    at most an hour (or none); never a 500 or a hang."""
    hints = ["999999999", "Wed, 21 Oct 2099 07:28:00 GMT", "-5", "nan", "1e9", "0"]

    async def refuse(request: web.Request) -> web.Response:
        n = int(request.match_info["key"].removeprefix("k").removesuffix(".tar"))
        status = 429 if n % 2 else 503
        return web.Response(status=status, text="slow down", headers={"Retry-After": hints[n]})

    def make_app() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{key}", refuse)
        return app

    hostile = AppThread(make_app, "hostile-retry-after")
    hostile.start()
    try:
        config = tmp_path / "shardcache.toml"
        config.write_text(f'[origins.a]\nurl = "{hostile.url}"\nmax_requests_per_second = 5\n')
        daemon = start_daemon(
            {}, "--config", str(config), "--origin-read-timeout", "2", "--readahead", "0"
        )
        for n, hint in enumerate(hints):
            began = time.monotonic()
            answer = curl(f"{daemon.url}/a/k{n}.tar", "--max-time", "30")
            took_s = time.monotonic() - began
            assert answer.status == 503, (hint, answer, daemon.log()[-2000:])
            assert took_s < 8, (hint, took_s)
            retry_after = answer.headers.get("retry-after")
            if retry_after is not None:
                assert retry_after.isdigit() and int(retry_after) <= 3600, (hint, retry_after)
        assert "Traceback" not in daemon.log()
    finally:
        hostile.stop()


@pytest.mark.parametrize("new_cap", [2, 1])
def test_a_reload_that_keeps_or_lowers_the_cap_does_not_exceed_it_while_bodies_stream(
    start_daemon: Callable[..., Daemon], tmp_path: Path, new_cap: int
) -> None:
    """`max_requests = 2`, two slow bodies streaming; a reload changes the origin's headers
    (a new backend) and keeps the cap, or lowers it to 1. Two more readers come: the store
    must still never send more than two bodies at once (the old bodies hold their places past
    the reload). Found with the lowered cap: three at once, when new caps made a new gate
    that knew nothing of the old one's places in use."""
    origin = PeakOrigin()
    origin.PACE_S = 0.25  # 8 pieces: 2 s a body
    origin.start()
    try:
        for n in range(4):
            origin.put(f"k{n}.tar", os.urandom(256 * KiB))
        config = tmp_path / "shardcache.toml"
        config.write_text(f'[origins.a]\nurl = "{origin.url}"\nmax_requests = 2\n')
        daemon = start_daemon(
            {}, "--config", str(config), "--origin-read-timeout", "10", "--readahead", "0"
        )
        answers: dict[int, CurlResult] = {}

        def ask(n: int) -> None:
            answers[n] = curl(f"{daemon.url}/a/k{n}.tar", "--max-time", "30")

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
        for thread in threads[:2]:
            thread.start()
        wait_for("two bodies streaming", lambda: sum(origin.gets.values()) >= 2, 15)
        before = daemon.log().count("reloaded: origins")
        config.write_text(
            f'[origins.a]\nurl = "{origin.url}"\nmax_requests = {new_cap}\n'
            'headers = { X-Job = "2" }\n'
        )
        os.kill(daemon.process.pid, signal.SIGHUP)
        wait_for("the reload", lambda: daemon.log().count("reloaded: origins") > before, 10)
        for thread in threads[2:]:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(a.status for a in answers.values()) == [200] * 4, answers
        assert origin.peak_sending <= 2, f"the origin sent {origin.peak_sending} bodies at once"
    finally:
        origin.stop()


def test_the_rest_of_an_answer_under_way_goes_before_new_readers_for_a_place(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`max_requests = 1`, 256 KiB segments, two connections a fill (its segments ask one
    after another): a reader's 1 MiB object is answered from its first
    segment's GET; four new readers of other objects then wait for the one place. The three
    GETs that continue the answer under way go first (they are never shed, and a reader holds
    a 200 that stops until they are sent), then the new readers'."""
    origin = PeakOrigin()
    origin.PACE_S = 0.1
    origin.start()
    try:
        origin.put("big.tar", big := os.urandom(1024 * KiB))
        for n in range(4):
            origin.put(f"k{n}.tar", os.urandom(256 * KiB))
        config = tmp_path / "shardcache.toml"
        config.write_text(f'[origins.a]\nurl = "{origin.url}"\nmax_requests = 1\n')
        daemon = start_daemon(
            {},
            "--config",
            str(config),
            "--origin-read-timeout",
            "30",
            "--segment-size",
            "256KiB",
            "--origin-connections",
            "2",
            "--readahead",
            "0",
        )
        answers: dict[str, CurlResult] = {}

        def ask(key: str) -> None:
            answers[key] = curl(f"{daemon.url}/a/{key}", "--max-time", "60")

        first = threading.Thread(target=ask, args=("big.tar",))
        first.start()
        wait_for("the big object's first GET", lambda: origin.gets["big.tar"] >= 1, 15)
        others = [threading.Thread(target=ask, args=(f"k{n}.tar",)) for n in range(4)]
        for thread in others:
            thread.start()
        for thread in [first, *others]:
            thread.join(90)
        assert answers["big.tar"].body == big
        order = [key for key, _ in origin.ranges]
        assert order[: order.count("big.tar")] == ["big.tar"] * order.count("big.tar"), order
    finally:
        origin.stop()


def test_a_reload_that_sets_a_cap_counts_the_bodies_begun_without_one(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """No `max_requests`, two slow bodies streaming; a reload sets `max_requests = 1`. A new
    reader waits until both bodies ended: the store never sends three at once, and
    `/_/status` counted the two in use. Found: GETs sent with no cap held no place, so the
    new cap saw none in use and let a third body start beside them."""
    origin = PeakOrigin()
    origin.PACE_S = 0.25  # 8 pieces: 2 s a body
    origin.start()
    try:
        for n in range(3):
            origin.put(f"k{n}.tar", os.urandom(256 * KiB))
        config = tmp_path / "shardcache.toml"
        config.write_text(f'[origins.a]\nurl = "{origin.url}"\n')
        daemon = start_daemon(
            {}, "--config", str(config), "--origin-read-timeout", "15", "--readahead", "0"
        )
        answers: dict[int, CurlResult] = {}

        def ask(n: int) -> None:
            answers[n] = curl(f"{daemon.url}/a/k{n}.tar", "--max-time", "30")

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(3)]
        for thread in threads[:2]:
            thread.start()
        wait_for("two bodies streaming", lambda: origin.sending >= 2, 15)
        before = daemon.log().count("reloaded: origins")
        config.write_text(f'[origins.a]\nurl = "{origin.url}"\nmax_requests = 1\n')
        os.kill(daemon.process.pid, signal.SIGHUP)
        wait_for("the reload", lambda: daemon.log().count("reloaded: origins") > before, 10)
        threads[2].start()
        for thread in threads:
            thread.join(60)
        assert sorted(a.status for a in answers.values()) == [200] * 3, answers
        assert origin.peak_sending <= 2, f"the origin sent {origin.peak_sending} bodies at once"
        _, status = daemon.get_json("/_/status")
        gate = status["origins"]["a"]["gate"]  # type: ignore[index]
        assert gate["in_use"] == 0 and gate["waiting_for_place"] == 0, gate
    finally:
        origin.stop()


def test_an_origin_removed_and_added_back_counts_the_bodies_still_streaming(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`max_requests = 1`, one slow body streaming; a reload removes the origin (its fill goes
    on through the retired backend), another adds it back as it was. A new reader waits for
    the body to end: the store never sends two at once. Found: the origin added back got a
    new gate, which knew nothing of the retired backend's place in use."""
    origin = PeakOrigin()
    origin.PACE_S = 0.25  # 8 pieces: 2 s a body
    origin.start()
    try:
        for n in range(2):
            origin.put(f"k{n}.tar", os.urandom(256 * KiB))
        spare = tmp_path / "spare"
        spare.mkdir()
        capped = f'[origins.a]\nurl = "{origin.url}"\nmax_requests = 1\n'
        other = f'[origins.spare]\nurl = "file://{spare}"\n'
        config = tmp_path / "shardcache.toml"
        config.write_text(capped + other)
        daemon = start_daemon(
            {}, "--config", str(config), "--origin-read-timeout", "15", "--readahead", "0"
        )
        answers: dict[int, CurlResult] = {}

        def ask(n: int) -> None:
            answers[n] = curl(f"{daemon.url}/a/k{n}.tar", "--max-time", "30")

        def reload(text: str) -> None:
            before = daemon.log().count("reloaded: origins")
            config.write_text(text)
            os.kill(daemon.process.pid, signal.SIGHUP)
            wait_for("the reload", lambda: daemon.log().count("reloaded: origins") > before, 10)

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(2)]
        threads[0].start()
        wait_for("a body streaming", lambda: origin.sending >= 1, 15)
        reload(other)
        reload(capped + other)
        threads[1].start()
        for thread in threads:
            thread.join(60)
        assert sorted(a.status for a in answers.values()) == [200] * 2, answers
        assert origin.peak_sending <= 1, f"the origin sent {origin.peak_sending} bodies at once"
    finally:
        origin.stop()


def test_a_reload_while_receivers_are_slow_to_start_does_not_cut_an_answer_under_way(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """A 2 MiB object fetched in 256 KiB segments (2 s each, two at a time) is streamed to a
    reader; a reload (nothing changed) restarts the receiving processes, and the new ones
    start nothing for 6 s (stopped: a loaded 2-core machine under a reload storm took over
    3 s to start them). The segments asked meanwhile continue the answer under way: they
    must wait, as the gate lets them, not be shed after the read timeout (3 s). Found: shed
    by the transport's local wait, cutting the reader's 200 short (curl exit 18, 524288 of
    1048576 bytes; in a reload storm, 12 to 15 cut answers in 20 s). They now wait
    CONTINUING_LOCAL_WAITS read timeouts (12 s here)."""
    origin = PeakOrigin()
    origin.PACE_S = 0.25  # 8 pieces: 2 s a segment
    origin.start()
    try:
        origin.put("big.tar", big := os.urandom(2048 * KiB))
        config = tmp_path / "shardcache.toml"
        config.write_text(f'[origins.a]\nurl = "{origin.url}"\n')
        daemon = start_daemon(
            {},
            "--config",
            str(config),
            "--origin-read-timeout",
            "3",
            "--readahead",
            "0",
            "--segment-size",
            "256KiB",
            "--origin-connections",
            "2",
        )
        answers: list[CurlResult] = []
        reader = threading.Thread(
            target=lambda: answers.append(curl(f"{daemon.url}/a/big.tar", "--max-time", "90"))
        )
        reader.start()
        wait_for("the first GET", lambda: origin.gets["big.tar"] >= 1, 15)
        before = daemon.log().count("reloaded: origins")
        os.kill(daemon.process.pid, signal.SIGHUP)
        wait_for("the reload", lambda: daemon.log().count("reloaded: origins") > before, 10)
        _, status = daemon.get_json("/_/status")
        pids: list[int] = status["receivers"]["pids"]  # type: ignore[index]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        asked_before_the_stop = origin.gets["big.tar"]
        try:
            time.sleep(6)  # what is tested: the receivers start nothing for this long
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        # Two segments at a time, 2 s each: some were asked while the receivers were stopped.
        assert asked_before_the_stop <= 6, "the segments were nearly all asked before the stop"
        reader.join(90)
        answer = answers[0]
        assert (answer.exit_code, answer.status) == (0, 200), (answer.exit_code, daemon.log())
        assert answer.body == big
    finally:
        origin.stop()
