"""What the daemon shows of its origins' URLs (`OriginTable.shown_urls`, read by `/_/origins`
and `/_/status`, and the start-up log line): no credential in a URL is ever shown, whether the
origin was configured at start or by a reload."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.origin_server import OriginServer


def _reload(daemon: Daemon, config: Path, text: str) -> None:
    """Rewrite the config file, SIGHUP, and wait for the daemon to say it reloaded."""
    before = daemon.log().count("reloaded: origins")
    config.write_text(text)
    os.kill(daemon.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while daemon.log().count("reloaded: origins") == before:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.02)


def test_no_credential_in_an_origin_url_is_shown(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Credentials a URL can carry, each a string that must not appear anywhere the daemon
    shows: a password with an empty user name (`https://:TOKEN@host`, how basic-auth tokens
    are often written), a token as the user name (`https://TOKEN@host`), an OAuth bearer
    token as a query parameter (RFC 6750 §2.3, `access_token=`) and a GCS signed URL's
    signature (`X-Goog-Signature=`). Found: all four shown verbatim in `/_/origins`,
    `/_/status` and the start-up log line (`redact` masks `user:PASSWORD@` with a user name,
    and only the query names token, sig and X-Amz-*)."""
    host = f"127.0.0.1:{origin.port}"
    secrets = {
        "empty-user": (f"http://:sekret-pw@{host}/", "sekret-pw"),
        "token-user": (f"http://sekret-user@{host}/", "sekret-user"),
        "bearer": (f"http://{host}/?access_token=sekret-bearer", "sekret-bearer"),
        "gcs": (f"http://{host}/?X-Goog-Signature=sekret-goog&X-Goog-Date=1", "sekret-goog"),
    }
    at_start = ("empty-user", "token-user")
    config = tmp_path / "shardcache.toml"
    config.write_text("".join(f'[origins.{n}]\nurl = "{secrets[n][0]}"\n' for n in at_start))
    daemon = start_daemon({}, "--config", str(config))
    # A reload adds the other two (and keeps the first two): shown the same way.
    _reload(
        daemon, config, "".join(f'[origins.{n}]\nurl = "{u}"\n' for n, (u, _) in secrets.items())
    )

    status, origins = daemon.get_json("/_/origins")
    named = origins["origins"]
    assert status == 200 and isinstance(named, dict) and set(named) == set(secrets), origins
    shown = {
        "/_/origins": str(origins),
        "/_/status": str(daemon.get_json("/_/status")[1]),
        "/metrics": urllib.request.urlopen(daemon.url + "/metrics", timeout=10).read().decode(),
        "the log": daemon.log(),
    }
    leaks = sorted(
        f"{name} ({secret}) in {where}"
        for name, (_, secret) in secrets.items()
        for where, text in shown.items()
        if secret in text
    )
    assert not leaks, "credentials shown:\n" + "\n".join(leaks)
