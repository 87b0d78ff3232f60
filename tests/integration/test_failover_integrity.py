"""A mirror or tier member that sends wrong bytes (issue 34, item 3): another object's bytes at
the right length and under the home's ETag, with no checksum of its own. The home's checksum
catches them; the failure counts against the upstream that sent them (its breaker opens, as
for a 5xx), the object is fetched again whole from the home, and no read is ever a splice.
Real daemon, two real HTTP upstreams on loopback, curl as the loader."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import CurlResult, curl, wait_for
from tests.origin_server import OriginServer

# 1 MiB objects come in the fill's first request; 5 MiB ones in segments (several GETs).
SIZES = {"shard-0.tar": 1 << 20, "shard-1.tar": 5 << 20, "shard-2.tar": 1 << 20}
PASSES = 4


@pytest.fixture
def servers() -> Iterator[tuple[OriginServer, OriginServer]]:
    liar, home = OriginServer(), OriginServer()
    liar.start()
    home.start()
    yield liar, home
    liar.stop()
    home.stop()


@pytest.mark.parametrize("role", ["mirror", "tier"])
def test_a_lying_upstream_is_marked_down_and_the_home_serves_its_keys(
    role: str,
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    liar, home = servers
    expected: dict[str, str] = {}
    for key, size in SIZES.items():
        data = os.urandom(size)
        expected[key] = hashlib.sha256(data).hexdigest()
        home.put(key, data)  # honest, with Content-MD5
        path = f"o/{key}" if role == "tier" else key  # a member serves the origin under /o/
        liar.put(path, os.urandom(size), claims_etag=home.etags[key], no_md5=True)
    config = tmp_path / "origins.toml"
    if role == "tier":
        config.write_text(f'[origins.o]\nurls = ["{home.url}"]\ntier = ["{liar.url}"]\n')
    else:
        config.write_text(f'[origins.o]\nurls = ["{liar.url}", "{home.url}"]\n')
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")

    results: list[tuple[int, str, int, str, str]] = []  # pass, key, curl exit, sha256, X-Shardcache
    for read_pass in range(PASSES):
        for key in SIZES:
            result = curl(f"{daemon.url}/o/{key}")
            how = result.headers.get("x-shardcache", "")
            results.append((read_pass, key, result.exit_code, result.sha256, how))
    failed = [r for r in results if r[2] != 0]
    print(
        f"lying {role}: {len(failed)} visible failures of {len(results)} reads; home "
        f"{sum(home.gets.values())} GETs, {sum(home.heads.values())} HEADs; liar "
        f"{sum(liar.gets.values())} GETs: {[r[:3] + r[4:] for r in results]}"
    )

    # Every read that succeeded is exactly the home's bytes: never the liar's, never a splice.
    wrong = [r for r in results if r[2] == 0 and r[3] != expected[r[1]]]
    assert not wrong, f"{len(wrong)} of {len(results)} reads handed over other bytes: {wrong}"
    # The liar's bytes reached a client at least once (the first read) and it failed visibly.
    assert failed and failed[0][:2] == (0, "shard-0.tar"), results
    # After that first failure the liar is down: the last passes are hits of the home's bytes.
    last = [r for r in results if r[0] >= PASSES - 2]
    assert all(r[2] == 0 and r[4] == "hit" for r in last), last
    assert len(failed) <= len(SIZES), results  # a few probes at most, never every read

    # The failure was counted against the liar, as integrity, and its breaker opened.
    _, status = daemon.get_json("/_/status")
    rows = status["origins"]["o"]["upstreams"]  # type: ignore[index]
    row = next(r for r in rows if r["url"] == liar.url)
    assert row["role"] == role
    assert row["failures"] >= 1 and row["integrity_failures"] >= 1, row
    assert "did not verify" in row["last_error"], row
    home_row = next(r for r in rows if r["role"] == "home")
    assert home_row["failures"] == 0 and home_row["state"] == "up", home_row
    labels = {"origin": "o", "upstream": liar.url, "role": role}
    assert daemon.metric("shardcache_upstream_integrity_failures_total", **labels) >= 1
    assert daemon.metric("shardcache_upstream_failures_total", **labels) >= 1
    # The home was asked for the bodies, not only for its checksum.
    assert all(home.gets[key] >= 1 for key in SIZES), home.gets
    assert "did not verify" in daemon.log() and "is down" in daemon.log()


def test_a_lying_mirror_of_an_object_streamed_through_is_marked_down(
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    # Larger than the cache: streamed through, verified on its way out, never landed by a fill.
    liar, home = servers
    data = os.urandom(4 << 20)
    home.put("big.tar", data)
    liar.put("big.tar", os.urandom(len(data)), claims_etag=home.etags["big.tar"], no_md5=True)
    config = tmp_path / "origins.toml"
    config.write_text(f'[origins.o]\nurls = ["{liar.url}", "{home.url}"]\n')
    daemon = start_daemon(
        {},
        "--config",
        str(config),
        "--readahead",
        "0",
        "--origin-connections",
        "1",
        cache_size="1MiB",
    )
    first = curl(f"{daemon.url}/o/big.tar")
    assert first.exit_code != 0  # it had the mirror's bytes: a visible failure
    # The mirror is down for 1 s, then probed by a GET (2 s after a second failure, 4 s…): on
    # a loaded machine a read may be that probe and fail again, but it never succeeds wrong.
    reads = [curl(f"{daemon.url}/o/big.tar") for _ in range(4)]
    expected = hashlib.sha256(data).hexdigest()
    assert all(r.exit_code != 0 or r.sha256 == expected for r in reads)
    assert reads[-1].exit_code == 0, [r.exit_code for r in reads]
    _, status = daemon.get_json("/_/status")
    row = status["origins"]["o"]["upstreams"][0]  # type: ignore[index]
    failed = 1 + sum(1 for r in reads if r.exit_code != 0)
    assert row["integrity_failures"] == failed and row["failures"] >= failed, row
    assert home.gets["big.tar"] >= 1


@pytest.mark.parametrize("extra_bytes", [0, 4096], ids=["same-length", "other-length"])
def test_a_stale_mirror_is_marked_down_and_the_home_serves_its_keys(
    extra_bytes: int,
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    """A mirror that serves another version under its own ETag (a stale copy, no checksum):
    the home's HEAD disagrees, the failure counts against the mirror as bytes it sent, and
    the object is fetched again from the home, as for bytes that fail their checksum."""
    stale, home = servers
    expected: dict[str, str] = {}
    for index in range(4):
        key = f"shard-{index}.tar"
        data = os.urandom(1 << 20)
        expected[key] = hashlib.sha256(data).hexdigest()
        home.put(key, data)
        stale.put(key, os.urandom(len(data) + extra_bytes), no_md5=True)
    config = tmp_path / "origins.toml"
    config.write_text(f'[origins.o]\nurls = ["{stale.url}", "{home.url}"]\n')
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")

    first = curl(f"{daemon.url}/o/shard-0.tar")
    assert first.exit_code != 0 or first.sha256 == expected["shard-0.tar"], first.status
    # Fetched again from the home without a second read asking for it.
    wait_for("the refetch from the home", lambda: home.gets["shard-0.tar"] >= 1)
    _, status = daemon.get_json("/_/status")
    row = status["origins"]["o"]["upstreams"][0]  # type: ignore[index]
    assert row["integrity_failures"] >= 1 and row["state"] != "up", row
    reads = [curl(f"{daemon.url}/o/{key}") for key in expected]
    print(f"stale mirror: first read exit {first.exit_code}, then {[r.exit_code for r in reads]}")
    pairs = zip(reads, expected, strict=True)
    assert all(r.exit_code != 0 or r.sha256 == expected[k] for r, k in pairs)
    assert reads[0].exit_code == 0 and reads[0].headers["x-shardcache"] in ("hit", "coalesced")


def test_a_fill_from_a_stale_mirror_never_answers_a_conditional(
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    """While a fill from a stale mirror waits for the home's HEAD (slow here), a client that
    holds the mirror's version asks If-None-Match with its ETag: the mirror's validators are
    not the object's until the home agrees, so no 304; the home's version is sent."""
    stale, home = servers
    data = os.urandom(1 << 20)
    home.put("s.tar", data, delay_s=2.0)  # its HEAD (and GET) answer after 2 s
    stale.put("s.tar", os.urandom(len(data)), no_md5=True)
    config = tmp_path / "origins.toml"
    config.write_text(f'[origins.o]\nurls = ["{stale.url}", "{home.url}"]\n')
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")
    url = f"{daemon.url}/o/s.tar"

    first = threading.Thread(target=curl, args=(url,))
    first.start()  # its fill gets the mirror's bytes, then waits for the home's HEAD
    wait_for("the mirror's GET", lambda: stale.gets["s.tar"] >= 1 and home.heads["s.tar"] >= 1)
    revalidated = curl(url, "-H", f"If-None-Match: {stale.etags['s.tar']}")
    first.join()
    assert revalidated.status != 304, revalidated.headers
    expected = hashlib.sha256(data).hexdigest()
    assert revalidated.exit_code != 0 or revalidated.sha256 == expected, revalidated.status


def test_a_conditional_joining_a_fill_from_a_stale_mirror_is_not_answered_from_it(
    servers: tuple[OriginServer, OriginServer],
    start_daemon: Callable[..., Daemon],
    tmp_path: Path,
) -> None:
    """The conditional's own check asks the home (2 s slow) and finds no answer to trust;
    meanwhile another reader started a fill from the stale mirror, which the conditional
    then joins: its validators still wait for the home before any 304."""
    stale, home = servers
    data = os.urandom(1 << 20)
    home.put("s.tar", data, delay_s=2.0)
    stale.put("s.tar", os.urandom(len(data)), no_md5=True)
    config = tmp_path / "origins.toml"
    config.write_text(f'[origins.o]\nurls = ["{stale.url}", "{home.url}"]\n')
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")
    url = f"{daemon.url}/o/s.tar"
    answers: list[CurlResult] = []

    def revalidate() -> None:
        answers.append(curl(url, "-H", f"If-None-Match: {stale.etags['s.tar']}"))

    conditional = threading.Thread(target=revalidate)
    conditional.start()
    wait_for("the conditional's HEAD at the home", lambda: home.heads["s.tar"] >= 1)
    plain = threading.Thread(target=curl, args=(url,))
    plain.start()  # its fill gets the mirror's bytes, then waits for the home's HEAD
    conditional.join()
    plain.join()
    assert answers[0].status != 304, answers[0].headers
    expected = hashlib.sha256(data).hexdigest()
    assert answers[0].exit_code != 0 or answers[0].sha256 == expected, answers[0].status
