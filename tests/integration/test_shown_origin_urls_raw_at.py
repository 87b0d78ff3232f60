"""An attack on `observability.logs.redact` as the daemon uses it: a credential the daemon
accepts in an origin URL must not show, in part or in full."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl
from tests.origin_server import OriginServer


def test_a_password_with_an_at_sign_is_not_shown_in_part(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`http://alice:hunter2@tail-sekret@host/`: a password with a raw '@' (users paste
    them unencoded; yarl, like urllib, splits userinfo at the LAST '@', so the origin works
    with password `hunter2@tail-sekret`). `redact`'s `[^/@\\s]+(?=@)` stops at the first '@'
    and masks only `hunter2`: `/_/origins` and the start-up line show `tail-sekret@host`."""
    origin.put("x.tar", b"abc")
    config = tmp_path / "shardcache.toml"
    config.write_text(
        f'[origins.a]\nurl = "http://alice:hunter2@tail-sekret@127.0.0.1:{origin.port}/"\n'
    )
    daemon = start_daemon({}, "--config", str(config))
    answer = curl(f"{daemon.url}/a/x.tar")
    assert (answer.status, answer.body) == (200, b"abc")  # the daemon took the URL as valid
    shown = {"/_/origins": str(daemon.get_json("/_/origins")[1]), "log": daemon.log()}
    leaked = {where: text for where, text in shown.items() if "tail-sekret" in text}
    assert not leaked, {
        where: [line for line in text.splitlines() if "tail-sekret" in line][:2]
        for where, text in leaked.items()
    }
