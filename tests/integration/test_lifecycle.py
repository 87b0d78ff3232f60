"""The daemon as a well-mannered service: sd_notify, draining on SIGTERM, reload on SIGHUP."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer

MiB = 1024 * 1024


def test_ready_and_stopping_are_sent_to_notify_socket(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(20)
        daemon = start_daemon({"web": origin.url}, env={"NOTIFY_SOCKET": str(path)})
        ready = listener.recv(4096).decode()
        assert "READY=1" in ready and f"MAINPID={daemon.process.pid}" in ready
        assert daemon.stop() == 0
        assert "STOPPING=1" in listener.recv(4096).decode()


def _readyz(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0


def test_sigterm_drains_a_transfer_in_flight(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    data = os.urandom(8 * MiB)
    origin.put("s.tar", data, chunk_delay_s=0.06)  # ~2 s through the origin
    origin.put("other.tar", b"o" * 1000)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    results = []
    client = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s.tar")))
    client.start()
    wait_for("the transfer's GET", lambda: origin.gets["s.tar"])
    os.kill(daemon.process.pid, signal.SIGTERM)
    wait_for("/readyz 503", lambda: _readyz(daemon.url) == 503, 5)  # /readyz fails at once…
    refused = curl(f"{daemon.url}/web/other.tar", "--no-fail")  # …new requests get 503…
    assert refused.status == 503 and refused.headers["retry-after"]
    client.join(30)  # …and the transfer in flight completes
    assert results[0].exit_code == 0 and results[0].sha256 == sha256(data)
    assert daemon.process.wait(30) == 0
    assert not list((cache_dir / "v1" / "partial").iterdir())

    restarted = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    assert curl(f"{restarted.url}/web/s.tar").headers["x-shardcache"] == "hit"


def test_grace_period_ends_a_transfer_that_is_too_slow(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    data = os.urandom(8 * MiB)
    origin.put("s.tar", data, chunk_delay_s=1.0)  # 8 s a segment: longer than the grace
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--shutdown-grace", "1", cache_dir=cache_dir)
    results = []
    client = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s.tar")))
    client.start()
    wait_for("the transfer's GET", lambda: origin.gets["s.tar"])
    began = time.monotonic()
    os.kill(daemon.process.pid, signal.SIGTERM)
    assert daemon.process.wait(30) == 0
    assert time.monotonic() - began < 10
    client.join(30)
    assert results[0].exit_code != 0 and len(results[0].body) < len(data)
    assert not list((cache_dir / "v1" / "partial").iterdir())
    restarted = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    assert restarted.get_json("/_/status")[1]["cache"]["entries"] == 0


def test_sighup_reloads_origins_and_keeps_transfers(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    data = os.urandom(4 * MiB)
    origin.put("a/s.tar", data, chunk_delay_s=0.05)
    origin.put("b/t.tar", b"t" * 1000)
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "{origin.url}/a"\n')
    daemon = start_daemon({}, "--config", str(config))
    results = []
    client = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/a/s.tar")))
    client.start()
    wait_for("the transfer's GET", lambda: origin.gets["a/s.tar"])

    # (flags win over the file, so the harness's --cache-size and --log-level stay put)
    config.write_text(
        f"prefetch_concurrency = 2\n"
        f'[origins.a]\nurl = "{origin.url}/a"\n[origins.b]\nurl = "{origin.url}/b"\n'
    )
    os.kill(daemon.process.pid, signal.SIGHUP)
    wait_for("origin b", lambda: "b" in daemon.get_json("/_/origins")[1]["origins"], 10)  # type: ignore[operator]
    assert curl(f"{daemon.url}/b/t.tar").body == b"t" * 1000
    client.join(30)
    assert results[0].exit_code == 0 and results[0].sha256 == sha256(data)
    assert "prefetch_concurrency changed; restart to apply" in daemon.log()

    config.write_text("[origins.a\nbroken")
    os.kill(daemon.process.pid, signal.SIGHUP)
    daemon.wait_for_log("reload failed", 10)
    assert set(daemon.get_json("/_/origins")[1]["origins"]) == {"a", "b"}  # type: ignore[arg-type]
