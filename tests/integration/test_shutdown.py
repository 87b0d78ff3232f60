"""Stopping on request: a second signal stops at once, and nothing new is fetched once the
daemon is on its way out; the commands find the daemon a config file names (issue 24, item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer
from tests.ports import free_port

MiB = 1024 * 1024


def test_a_second_signal_stops_without_waiting_out_the_grace(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """Ctrl-C, then Ctrl-C again: the slow transfer is aborted (never a clean short body) and
    the daemon exits within seconds, not after the 60 s grace."""
    data = os.urandom(8 * MiB)
    origin.put("s.tar", data, chunk_delay_s=1.0)  # 8 s a segment
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--shutdown-grace", "60", cache_dir=cache_dir)
    results = []
    client = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s.tar")))
    client.start()
    wait_for("the fill to start", lambda: origin.gets["s.tar"] > 0)
    os.kill(daemon.process.pid, signal.SIGINT)
    wait_for("the drain to begin", lambda: "shutting down" in daemon.log())
    began = time.monotonic()
    os.kill(daemon.process.pid, signal.SIGINT)
    assert daemon.process.wait(30) == 0, daemon.log()
    assert time.monotonic() - began < 5
    client.join(30)
    assert results[0].exit_code != 0 and len(results[0].body) < len(data)
    assert "second signal" in daemon.log()
    assert not list((cache_dir / "v1" / "partial").iterdir())


def test_no_read_ahead_starts_once_shutdown_begins(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """A client still reading holds the drain; the read-ahead it set off is not fetched meanwhile
    (its shards would be discarded at the end of the drain anyway)."""
    data = os.urandom(4 * MiB)
    origin.put("s_000.tar", data, chunk_delay_s=0.25)  # ~4 s
    for n in range(1, 9):
        origin.put(f"s_{n:03d}.tar", os.urandom(MiB), chunk_bytes=64 * 1024, chunk_delay_s=0.05)
    daemon = start_daemon({"web": origin.url}, "--readahead", "8", "--prefetch-concurrency", "1")
    results = []
    client = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s_000.tar")))
    client.start()
    wait_for("read-ahead to start", lambda: origin.gets["s_001.tar"] > 0)
    os.kill(daemon.process.pid, signal.SIGTERM)
    wait_for("the drain to begin", lambda: "shutting down" in daemon.log())
    started = sum(origin.gets[f"s_{n:03d}.tar"] for n in range(1, 9))
    client.join(30)
    assert results[0].exit_code == 0 and results[0].sha256 == sha256(data)  # drained
    assert daemon.process.wait(30) == 0, daemon.log()
    # Read-ahead of 1 MiB at ~1.3 MB/s, one at a time, over a ~4 s drain: 2-3 more would start.
    assert sum(origin.gets[f"s_{n:03d}.tar"] for n in range(1, 9)) == started
    wait_for("the origin to see every fill hang up", lambda: origin.sending == 0, 10)


def test_stats_with_a_config_asks_the_daemon_that_config_listens_on(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    from tests.integration.helpers import run_cli

    daemon = start_daemon({"web": origin.url})
    config = tmp_path / "c.toml"
    config.write_text(f'listen = "{daemon.url.removeprefix("http://")}"\n')
    result = run_cli("stats", "--json", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert '"cache"' in result.stdout
    for env in (
        {"SHARDCACHE_CONFIG": str(config)},
        {"SHARDCACHE_LISTEN": daemon.url.removeprefix("http://")},
    ):
        by_env = run_cli("stats", "--json", env=env)  # as a daemon would read it, too
        assert by_env.returncode == 0 and '"cache"' in by_env.stdout, by_env.stderr
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('listen = "127.0.0.1:9"\n')
    refused = run_cli("stats", "--config", str(wrong))
    assert refused.returncode != 0 and "127.0.0.1:9" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_prefetch_with_a_config_warms_the_daemon_that_config_listens_on(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    from tests.integration.helpers import run_cli

    data = os.urandom(MiB)
    origin.put("s_000.tar", data)
    daemon = start_daemon({"web": origin.url})
    config = tmp_path / "c.toml"
    config.write_text(
        f'listen = "{daemon.url.removeprefix("http://")}"\n[origins.web]\nurl = "{origin.url}"\n'
    )
    result = run_cli("prefetch", "--wait", "--config", str(config), f"{origin.url}/s_000.tar")
    assert result.returncode == 0, result.stderr
    hit = curl(f"{daemon.url}/web/s_000.tar")
    assert hit.headers["x-shardcache"] == "hit" and hit.sha256 == sha256(data)


def _serve_process(
    cache_dir: Path, *extra: str, start_new_session: bool = False
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardcache",
            "serve",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--cache-dir",
            str(cache_dir),
            "--origin",
            "web=http://127.0.0.1:9",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=start_new_session,
    )


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a SIGTERM handler yet (the CLI's, set once `main` runs)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.parametrize("after_s", [0.0, 0.1, 0.2])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_stop_at_any_moment_of_start_up_is_honoured(
    tmp_path: Path, signum: int, after_s: float
) -> None:
    """Re-attack: a signal in the handover from the CLI's handler to the loop's was lost (the
    daemon served on; 3 of 62 tries near 0.3 s) or came out as a RuntimeError from an import.
    Whenever it comes after the interpreter reached `main`, the daemon exits 0, promptly: the
    signal goes `after_s` after the CLI's handler exists (a fixed time after exec was often
    before `main` on a loaded machine, where a signal still has its default effect)."""
    process = _serve_process(tmp_path / "cache")
    wait_for("the CLI's signal handler", lambda: _catches_sigterm(process.pid), 30)
    time.sleep(after_s)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=15)
    assert process.returncode == 0, output
    assert "Traceback" not in output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_stop_during_start_up_is_a_clean_exit(tmp_path: Path, signum: int) -> None:
    """Review attack: a stop before the daemon was ready died of the signal (143), or with a
    KeyboardInterrupt traceback; systemd may stop a unit that is still starting. Signalled as
    soon as start-up made the cache dir (before the interpreter reached `main`, ~0.15 s after
    exec, a signal still has its default effect: nothing of the daemon exists yet)."""
    cache_dir = tmp_path / "cache"
    process = _serve_process(cache_dir)
    wait_for("start-up to make the cache dir", cache_dir.exists)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "Traceback" not in output


def test_ctrl_c_while_receivers_start_is_a_clean_exit(tmp_path: Path) -> None:
    """New-user trial: a Ctrl-C in the terminal reaches the whole foreground process group;
    receivers still importing (before they ignore SIGINT) died of it with a KeyboardInterrupt
    traceback each. Here the daemon runs in a group of its own, as under a shell, and the
    group is signalled as soon as the first receiver exists."""
    process = _serve_process(tmp_path / "cache", "--receivers", "6", start_new_session=True)
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    wait_for("a receiver process", lambda: bool(children.read_text().split()), 30)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
