"""`shardcache ls`, `purge` and `stats` against a running daemon (issue 27), and the
`/_/cache` routes they use, hostile input included. The daemon runs as users run it, with a
file origin and a real HTTP origin (keys percent-encoded into its cache keys)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli, wait_for
from tests.origin_server import OriginServer

TOKEN = secrets.token_hex(16)
SIZES = {f"train-{n:03d}.tar": (n + 1) * 50_000 for n in range(4)}


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    root = tmp_path / "shards"
    root.mkdir()
    for name, size in SIZES.items():
        (root / name).write_bytes(os.urandom(size))
    (root / "val-000.tar").write_bytes(os.urandom(1000))
    return root


@pytest.fixture
def daemon(shards: Path, origin: OriginServer, start_daemon: Callable[..., Daemon]) -> Daemon:
    origin.put("a b.tar", os.urandom(3000))
    return start_daemon(
        {"d": f"file://{shards}", "web": origin.url},
        "--readahead",
        "0",
        env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
        token=TOKEN,
    )


def _cli(daemon: Daemon, *args: str) -> tuple[int, str, str]:
    result = run_cli(*args, "--daemon", daemon.url, env={"SHARDCACHE_ADMIN_TOKEN": TOKEN})
    assert "Traceback" not in result.stderr
    return result.returncode, result.stdout, result.stderr


def _rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines()[1:] if line.strip()]  # after the header


def _get(daemon: Daemon, url: str) -> None:
    result = curl(url, "-H", f"Authorization: Bearer {TOKEN}")
    assert result.exit_code == 0, result


def test_ls_shows_what_is_cached_and_purge_drops_a_glob(daemon: Daemon) -> None:
    for name in ("train-000.tar", "train-001.tar", "train-002.tar", "val-000.tar"):
        _get(daemon, f"{daemon.url}/d/{name}")
    _get(daemon, f"{daemon.url}/web/a%20b.tar")
    code, _, err = _cli(daemon, "prefetch", "--lookahead", "/d/train-003.tar")
    assert code == 0, err
    wait_for(
        "the look-ahead cached",
        lambda: daemon.get_json("/_/cache?origin=d&pattern=*3.tar")[1]["entries"],
    )

    code, out, err = _cli(daemon, "ls", "--json")
    assert code == 0, err
    listed = {(e["origin"], e["key"]): e for e in map(json.loads, out.splitlines())}
    assert sorted(listed) == [("d", n) for n in sorted([*SIZES, "val-000.tar"])] + [
        ("web", "a b.tar")
    ]
    entry = listed[("d", "train-001.tar")]
    assert entry["size_bytes"] == SIZES["train-001.tar"]
    assert 0 <= entry["age_s"] < 60 and entry["read_at"] >= entry["stored_at"]
    assert "length" in entry["verified_by"]
    assert entry["pinned_by"] == []
    assert listed[("d", "train-003.tar")]["pinned_by"] == ["look-ahead"]  # prefetched, unread
    assert err.strip() == f"6 entries, {_size(sum(SIZES.values()) + 1000 + 3000)}"

    code, out, _ = _cli(daemon, "ls", "d", "train-00[12]*")
    assert [row.split()[-1] for row in _rows(out)] == ["d/train-001.tar", "d/train-002.tar"]
    assert "look-ahead" not in out
    code, out, _ = _cli(daemon, "ls", "web", "a b*")
    assert [row.split("  ")[-1] for row in _rows(out)] == ["web/a b.tar"]
    code, out, err = _cli(daemon, "ls", "--limit", "2")
    assert code == 0 and len(_rows(out)) == 2 and "--limit 0 shows all" in err

    code, out, err = _cli(daemon, "purge", "d", "train-00[01]*", "--dry-run")
    assert code == 0 and [r.split()[-1] for r in _rows(out)] == [
        "d/train-000.tar",
        "d/train-001.tar",
    ]
    assert "nothing purged" in err
    assert len(daemon.get_json("/_/cache?origin=d")[1]["entries"]) == 5  # type: ignore[arg-type]

    code, out, err = _cli(daemon, "purge", "d", "train-00[01]*")
    assert code == 0, err
    assert out.strip() == (
        f"purged 2 entries ({_size(SIZES['train-000.tar'] + SIZES['train-001.tar'])}) of "
        "origin d matching 'train-00[01]*'"
    )
    assert (
        curl(f"{daemon.url}/d/train-000.tar", "-H", f"Authorization: Bearer {TOKEN}").headers[
            "x-shardcache"
        ]
        == "miss"
    )
    again = curl(f"{daemon.url}/d/train-002.tar", "-H", f"Authorization: Bearer {TOKEN}")
    assert again.headers["x-shardcache"] == "hit"
    code, out, _ = _cli(daemon, "purge", "d", "*")
    assert code == 0 and out.startswith("purged 4 entries")
    code, out, err = _cli(daemon, "ls", "d")
    assert (code, out, err.strip()) == (0, "", "0 entries, 0 B")


def test_a_purge_does_not_cut_a_read_of_the_entry_under_way(
    shards: Path, start_daemon: Callable[..., Daemon]
) -> None:
    data = os.urandom(32 << 20)  # far more than the socket buffers hold
    (shards / "big.tar").write_bytes(data)
    daemon = start_daemon({"d": f"file://{shards}"}, "--readahead", "0")
    assert curl(f"{daemon.url}/d/big.tar").exit_code == 0  # cached
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    connection.request("GET", "/d/big.tar")
    response = connection.getresponse()
    assert response.getheader("X-Shardcache") == "hit"
    head = response.read(64 << 10)
    purged = run_cli("purge", "d", "big*", "--daemon", daemon.url)
    assert purged.returncode == 0 and purged.stdout.startswith("purged 1 entry "), purged
    rest = response.read()
    connection.close()
    assert hashlib.sha256(head + rest).digest() == hashlib.sha256(data).digest()
    assert curl(f"{daemon.url}/d/big.tar").headers["x-shardcache"] == "miss"


def test_stats_shows_bytes_read_from_origins_beside_bytes_served(
    shards: Path, start_daemon: Callable[..., Daemon]
) -> None:
    """The issue's case: prefetched shards are hits when read, yet came from the origin."""
    daemon = start_daemon({"d": f"file://{shards}"}, "--readahead", "0")
    names = sorted(SIZES)
    warmed = run_cli("prefetch", "--wait", *[f"/d/{n}" for n in names], "--daemon", daemon.url)
    assert warmed.returncode == 0, warmed.stderr
    for name in names:
        assert curl(f"{daemon.url}/d/{name}").headers["x-shardcache"] == "hit"
    total = sum(SIZES.values())

    document = json.loads(run_cli("stats", "--json", "--daemon", daemon.url).stdout)
    assert document["hit_ratio"]["bytes"] == 1.0  # every byte served was a hit …
    assert document["origin_bytes"] == sum(document["bytes"].values()) == total
    assert document["origins"]["d"]["origin_bytes"] == total  # … and came from the origin
    text = run_cli("stats", "--daemon", daemon.url).stdout
    assert (
        f"from origins   {_size(total)} read for {_size(total)} served (100.0% of the bytes served)"
        in text
    )
    assert "read origin" in text


HOSTILE = [
    ("GET", "/_/cache", 400, "name the origin"),
    ("GET", "/_/cache?origin=", 400, "name the origin"),
    ("GET", "/_/cache?origin=nope", 404, "no origin named"),
    ("GET", "/_/cache?origin=d&pattern=" + "a" * 2000, 400, "a pattern is a glob"),
    ("GET", "/_/cache?origin=d&pattern=", 400, "a pattern is a glob"),
    ("GET", "/_/cache?origin=d&pattern=%00", 400, "a pattern is a glob"),
    ("GET", "/_/cache?origin=d&pattern=%0A*", 400, "a pattern is a glob"),
    ("GET", "/_/cache?origin=d&limit=0", 400, "limit must be"),
    ("GET", "/_/cache?origin=d&limit=1001", 400, "limit must be"),
    ("GET", "/_/cache?origin=d&limit=-1", 400, "limit must be"),
    ("GET", "/_/cache?origin=d&limit=%EF%BC%91", 400, "limit must be"),  # a fullwidth 1
    ("GET", "/_/cache?origin=d&after=" + "x" * 5000, 400, "not a cursor"),
    ("GET", "/_/cache?origin=d&after=%01", 400, "not a cursor"),
    ("GET", "/_/cache?origin=d&sort=size", 400, "unknown query field"),
    ("GET", "/_/cache?origin=d&origin=web", 400, "given twice"),
    ("DELETE", "/_/cache?origin=d", 400, "name what to purge"),
    ("DELETE", "/_/cache?pattern=*", 400, "name the origin"),
    ("DELETE", "/_/cache?origin=nope&pattern=*", 404, "no origin named"),
    ("DELETE", "/_/cache?origin=d&pattern=" + "*" * 1025, 400, "a pattern is a glob"),
    ("POST", "/_/cache?origin=d", 405, "not allowed"),
]


def test_hostile_cache_requests_get_a_4xx_with_a_json_error(daemon: Daemon) -> None:
    _get(daemon, f"{daemon.url}/d/val-000.tar")
    for method, path, status, needle in HOSTILE:
        for token in (None, "wrong-" + TOKEN[6:], TOKEN):
            answered, body, took = _send(daemon, method, path, token)
            expected = status if token == TOKEN else 401
            assert answered == expected, (method, path[:80], token, body)
            assert isinstance(body.get("error"), str), body
            if token == TOKEN:
                assert needle in body["error"], (path[:80], body)
            assert took < 1.0, (method, path[:80], took)
    assert _send(daemon, "GET", "/_/cache?origin=d", TOKEN)[0] == 200
    assert len(daemon.get_json("/_/cache?origin=d")[1]["entries"]) == 1  # nothing purged
    assert "Traceback" not in daemon.log()

    # The command line says the same in one line, exit 2.
    refused = run_cli("ls", "d", "--daemon", daemon.url)  # no token in its environment
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "401" in refused.stderr and "SHARDCACHE_ADMIN_TOKEN" in refused.stderr
    code, _, err = _cli(daemon, "purge", "nope", "*")
    assert code == 2 and "no origin named 'nope'" in err and len(err.strip().splitlines()) == 1


def _send(
    daemon: Daemon, method: str, path: str, token: str | None
) -> tuple[int, dict[str, str], float]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(daemon.url + path, method=method, headers=headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read()), time.monotonic() - started


def _size(n: int) -> str:
    from shardcache.units import format_size

    return format_size(n)
