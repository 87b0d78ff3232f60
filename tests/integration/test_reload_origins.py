"""Reloading origins on SIGHUP (issue 23, item 6): an origin's state is built and closed with
it. An origin added by a reload is limited like one configured at start-up, and the clients of
origins a reload replaced are closed, their pooled connections with them."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import wait_for
from tests.origin_server import OriginServer

KiB = 1024


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, http.client.HTTPException):  # no answer, or a cut one
        return 0


def _reload(daemon: Daemon, config: Path, text: str) -> None:
    """Rewrite the config file, SIGHUP, and wait for the daemon to say it reloaded."""
    before = daemon.log().count("reloaded: origins")
    config.write_text(text)
    os.kill(daemon.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while daemon.log().count("reloaded: origins") == before:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.02)


def _sockets_to(pid: int, port: int) -> int:
    """How many TCP sockets process `pid` holds to loopback port `port` (any state)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed since the listing
            continue
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(match.group(1))
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[9] in inodes:
                count += 1
    return count


def test_an_origin_added_by_reload_is_limited(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """Found: a reloaded-in origin had no limiter, 57% of its requests were refused and its
    limit gauge stayed 0."""
    keys = [f"r-{n:03d}.tar" for n in range(96)]
    for key in keys:
        origin.put(key, os.urandom(4 * KiB), delay_s=0.02)
    origin.slow_down_above_rps = 40
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "{origin.url}"\n')
    daemon = start_daemon({}, "--config", str(config))
    _reload(
        daemon, config, f'[origins.a]\nurl = "{origin.url}"\n[origins.b]\nurl = "{origin.url}"\n'
    )

    todo = iter(keys)
    lock = threading.Lock()
    statuses: list[int] = []

    def reader() -> None:
        while True:
            with lock:
                key = next(todo, None)
            if key is None:
                return
            status = _get(f"{daemon.url}/b/{key}")
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=reader) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert sorted(statuses) == [200] * len(keys)
    assert origin.refused_at, "the origin never throttled: the test drove too little"
    assert "origin b is throttling us" in daemon.log()
    refused, accepted = len(origin.refused_at), len(origin.accepted_at)
    assert refused <= 0.25 * (refused + accepted), (refused, accepted)


def test_reload_closes_the_clients_of_replaced_origins(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """Found: 60 reloads that rebuilt an origin left 120 sockets in CLOSE_WAIT."""
    for n in range(40):
        origin.put(f"c-{n:02d}.tar", os.urandom(KiB))
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "{origin.url}"\n')
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")

    def read_two(round_: int) -> None:  # two at once: two pooled connections
        threads = [
            threading.Thread(target=_get, args=(f"{daemon.url}/a/c-{2 * round_ + i:02d}.tar",))
            for i in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    read_two(0)
    for round_ in range(1, 11):  # each reload changes the spec, so the client is rebuilt
        text = f'[origins.a]\nurl = "{origin.url}"\nmax_requests = {100 + round_}\n'
        _reload(daemon, config, text)
        read_two(round_)
    assert len(origin.gets) == 22  # every round reached the origin, on the client of its day
    # The replaced clients close once their requests are done: only the current one's stay,
    # at most 4 (two reads at once, each a GET and the HEAD for the object's checksum).
    held = [0]

    def only_the_current() -> bool:
        held[0] = _sockets_to(daemon.process.pid, origin.port)
        return held[0] <= 4

    with contextlib.suppress(AssertionError):
        wait_for("the replaced clients' sockets to close", only_the_current, 10)
    assert held[0] <= 4, f"{held[0]} sockets to the origin after 10 reloads"


def test_a_renamed_origin_leaves_metrics_and_the_others_keep_counting(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """Found: 30 renames left 33 origins' series in /metrics. A removed or renamed origin's
    series go with the reload; a kept origin's counters carry on."""
    origin.put("s.tar", os.urandom(KiB))
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "{origin.url}"\n[origins.b]\nurl = "{origin.url}"\n')
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")
    assert _get(f"{daemon.url}/a/s.tar") == 200 and _get(f"{daemon.url}/b/s.tar") == 200
    for n in range(5):  # b renamed five times over
        _reload(
            daemon,
            config,
            f'[origins.a]\nurl = "{origin.url}"\n[origins.b{n}]\nurl = "{origin.url}"\n',
        )
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    labelled = set(re.findall(r'origin="([^"]*)"', text))
    assert labelled == {"a", "b4"}, labelled
    assert daemon.metric("shardcache_requests_total", origin="a", result="miss") == 1
