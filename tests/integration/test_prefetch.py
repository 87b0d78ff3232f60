"""Prefetch: the queue, the look-ahead bound, read-ahead, the CLI, and a WebDataset pipeline."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import webdataset as wds

from shardcache.loader.sample import write_sample_shards
from shardcache.loader.webdataset import prefetch_ahead
from tests.integration.helpers import curl, disk_usage, sha256, wait_for
from tests.origin_server import OriginServer

MiB = 1024 * 1024


def _post(daemon, body: object) -> tuple[int, dict[str, object]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(daemon.url + "/_/prefetch", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_idle(daemon, done: int, timeout_s: float = 30) -> dict[str, object]:
    """Wait until `done` prefetches finished and nothing runs; return the queue status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = daemon.get_json("/_/prefetch")[1]
        if status["done"] + status["failed"] >= done and status["in_flight"] == 0:
            return status
        assert time.monotonic() < deadline, f"prefetch did not settle: {status}"
        time.sleep(0.05)


def test_prefetched_shards_are_hits_with_one_origin_request_each(
    origin: OriginServer, start_daemon
) -> None:
    blobs = {f"s_{i:03d}.tar": os.urandom(300_000) for i in range(5)}
    for key, data in blobs.items():
        origin.put(key, data)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")

    status, answer = _post(daemon, {"origin": "web", "keys": ["s_{000..004}.tar"]})
    assert (status, answer["queued"], answer["cached"], answer["in_flight"]) == (202, 5, 0, 0)
    _wait_idle(daemon, done=5)
    again = _post(daemon, {"urls": ["/web/s_{000..004}.tar"]})[1]
    assert again["cached"] == 5 and again["queued"] == 0

    for key, data in blobs.items():
        result = curl(f"{daemon.url}/web/{key}")
        assert result.headers["x-shardcache"] == "hit" and result.sha256 == sha256(data)
        assert origin.gets[key] == 1


def test_cli_prefetch_wait_and_url(origin: OriginServer, start_daemon) -> None:
    for i in range(3):
        origin.put(f"d/s_{i:03d}.tar", os.urandom(200_000))
    daemon = start_daemon({"web": f"{origin.url}/d"}, "--readahead", "0")
    env = {**os.environ, "SHARDCACHE_URL": daemon.url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shardcache", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    mapped = cli("url", "--pipe", f"{origin.url}/d/s_{{000..002}}.tar")
    assert mapped.stdout.strip() == f"pipe:curl -s -f {daemon.url}/web/s_{{000..002}}.tar"
    offline = cli("url", "--origin", "lake=s3://bucket/train", "s3://bucket/train/a_{0..9}.tar")
    assert offline.stdout.strip() == f"{daemon.url}/lake/a_{{0..9}}.tar"
    uncovered = cli("url", "s3://elsewhere/x.tar")
    assert uncovered.returncode == 2 and "no configured origin covers" in uncovered.stderr

    done = cli("prefetch", "--wait", f"{origin.url}/d/s_{{000..002}}.tar")
    assert done.returncode == 0, done.stderr
    assert all(
        curl(f"{daemon.url}/web/s_{i:03d}.tar").headers["x-shardcache"] == "hit" for i in range(3)
    )
    failed = cli("prefetch", "--wait", "/web/missing.tar")
    assert failed.returncode == 1 and "missing.tar failed" in failed.stderr


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        {"urls": "x"},
        {"urls": ["relative/path"]},
        {"origin": "zz", "keys": ["a"]},
        {"urls": ["/web/a/../b.tar"]},
        {"urls": ["/web/{a,b.tar"]},
        {"keys": ["a"]},
        {"urls": ["/web/ok.tar", "/nope/x.tar"]},
        {"urls": []},
        {"urls": ["/web/a"], "extra": 1},
    ],
)
def test_bad_bodies_are_400_and_queue_nothing(
    origin: OriginServer, start_daemon, body: object
) -> None:
    origin.put("ok.tar", b"x" * 100)
    daemon = start_daemon({"web": origin.url})
    status, answer = _post(daemon, body)
    assert status == 400 and answer["error"]
    queue = daemon.get_json("/_/prefetch")[1]
    assert (queue["pending"], queue["in_flight"], queue["done"]) == (0, 0, 0)
    assert sum(origin.gets.values()) == 0


def test_look_ahead_bound_and_no_thrash(origin: OriginServer, start_daemon, tmp_path) -> None:
    blobs = {f"s_{i:03d}.tar": os.urandom(MiB) for i in range(10)}
    for key, data in blobs.items():
        origin.put(key, data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon(
        {"web": origin.url},
        "--readahead",
        "0",
        "--prefetch-max-bytes",
        "3MiB",
        # Room for three prefetched shards, the one being read and the next one filling, and
        # two more: the index takes about 0.6 MiB of the size, and on a slow disk a fill's
        # commit lags its last byte, so its room is still reserved when the next one starts.
        # A prefetch that found no room once sent its GET anyway and streamed through (CI saw
        # s_009 fetched twice with 6 and 7 MiB); the store now says no first (would_admit).
        cache_size="8MiB",
        cache_dir=cache_dir,
    )
    assert _post(daemon, {"urls": ["/web/s_{000..009}.tar"]})[0] == 202
    status = _wait_idle(daemon, done=3)
    time.sleep(0.3)  # give an (incorrect) fourth prefetch the chance to start
    status = daemon.get_json("/_/prefetch")[1]
    assert status["done"] == 3 and status["unread_bytes"] == 3 * MiB
    assert [origin.gets[f"s_{i:03d}.tar"] for i in range(10)] == [1, 1, 1] + [0] * 7

    results = []
    for key, data in blobs.items():  # the loader reads in order, as fast as it can
        result = curl(f"{daemon.url}/web/{key}")
        assert result.sha256 == sha256(data)
        results.append(result.headers["x-shardcache"])
        assert disk_usage(cache_dir) <= 8 * MiB
    # The first three were prefetched and read as hits: reading never waited on them.
    assert results[:3] == ["hit"] * 3
    # No thrash: no prefetched shard was evicted unread, and each was fetched exactly once
    # (a loader that outruns the prefetcher gets an ordinary miss, never a second fetch).
    assert daemon.metric("shardcache_prefetch_wasted_total", origin="web") == 0
    assert all(origin.gets[key] == 1 for key in blobs), origin.gets


def test_read_ahead_follows_numbering_and_stops_at_the_end(
    origin: OriginServer, start_daemon
) -> None:
    for i in range(5):
        origin.put(f"train/s_{i:03d}.tar", os.urandom(100_000))
    for i in range(3):
        origin.put(f"train-{i:05d}-of-00003.tar", os.urandom(100_000))
    daemon = start_daemon({"web": origin.url}, "--readahead", "2")

    curl(f"{daemon.url}/web/train/s_000.tar")
    _wait_idle(daemon, done=2)
    assert [origin.gets[f"train/s_{i:03d}.tar"] for i in range(5)] == [1, 1, 1, 0, 0]
    curl(f"{daemon.url}/web/train/s_003.tar")  # wants s_004 and s_005, which does not exist
    curl(f"{daemon.url}/web/train-00001-of-00003.tar")  # wants 00002 only: 00003 is past the end
    status = _wait_idle(daemon, done=4)  # s_001, s_002, s_004, 00002 (items start side by side)
    assert status["failed"] == 0
    assert origin.gets["train/s_004.tar"] == 1
    assert origin.gets["train-00002-of-00003.tar"] == 1
    assert curl(f"{daemon.url}/web/train/s_004.tar").headers["x-shardcache"] == "hit"


def _epoch(url: str, stage: list[object], seconds_per_sample: float) -> int:
    pipeline = wds.DataPipeline(wds.SimpleShardList(url), *stage, wds.tarfile_to_samples())
    count = 0
    for _ in pipeline:
        time.sleep(seconds_per_sample)  # "decoding" at a fixed rate
        count += 1
    return count


def test_webdataset_stage_keeps_the_loader_ahead_of_a_slow_origin(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    # The origin takes 0.4 s a request; the loader decodes a shard in 1 s: a link that can
    # keep up with 0.6 s to spare per shard (a loaded CI machine's curl and process start-up
    # ate 0.2 s of spare), so with the stage only the first shard should make the loader wait.
    shards = write_sample_shards(
        tmp_path / "shards", shards=6, samples_per_shard=5, payload_bytes=4096
    )
    for path in shards:
        origin.put(path.name, path.read_bytes(), delay_s=0.4)
    url = "pipe:curl -s -f {}/web/shards_{{000..005}}.tar"

    plain = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=tmp_path / "a")
    assert _epoch(url.format(plain.url), [], 0.12) == 30
    waited_without = plain.metric("shardcache_client_wait_seconds_total", origin="web")

    staged = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=tmp_path / "b")
    stage = [prefetch_ahead(2, daemon=staged.url)]
    assert _epoch(url.format(staged.url), stage, 0.2) == 30
    waited_with = staged.metric("shardcache_client_wait_seconds_total", origin="web")

    # Only the first shard is a miss: every later one was cached or in flight when asked for.
    assert staged.metric("shardcache_requests_total", origin="web", result="miss") == 1
    assert (
        staged.metric("shardcache_requests_total", origin="web", result="hit")
        + staged.metric("shardcache_requests_total", origin="web", result="coalesced")
        == 5
    )
    assert waited_with < waited_without / 3, (waited_with, waited_without)
    print(f"client wait: {waited_without:.2f}s without the stage, {waited_with:.2f}s with it")


def test_the_stage_posts_its_plan_and_prefetches_even_where_plans_are_refused(
    origin: OriginServer, start_daemon, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    shards = write_sample_shards(
        tmp_path / "shards", shards=4, samples_per_shard=3, payload_bytes=1024
    )
    for path in shards:
        origin.put(path.name, path.read_bytes(), delay_s=0.2)
    url = "pipe:curl -s -f {}/web/shards_{{000..003}}.tar"

    planning = start_daemon(
        {"web": origin.url}, "--readahead", "0", "--eviction", "auto", cache_dir=tmp_path / "a"
    )
    assert _epoch(url.format(planning.url), [prefetch_ahead(1)], 0.1) == 12
    plans = planning.get_json("/_/status")[1]["cache"]["eviction"]["plans"]  # type: ignore[index]
    # The same order each epoch (no shuffle): the plan goes on with the next four epochs'.
    assert [(p["epoch"], p["position"], p["length"]) for p in plans] == [(0, 4, 20)]

    lru = start_daemon(
        {"web": origin.url}, "--readahead", "0", "--eviction", "lru", cache_dir=tmp_path / "b"
    )
    with caplog.at_level(logging.DEBUG, logger="shardcache.webdataset"):
        assert _epoch(url.format(lru.url), [prefetch_ahead(1)], 0.1) == 12
    assert "reading on without a plan" in caplog.text
    assert lru.metric("shardcache_prefetch_completed_total") >= 3  # look-ahead still works


def test_the_stage_flows_from_an_endless_source_posting_its_plan_in_windows(
    origin: OriginServer, start_daemon, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wds.ResampledShards` never ends: the stage must hand shards on at once and name a
    bounded window of them in its plan, posted again as the loader moves through it."""
    monkeypatch.setattr("shardcache.loader.webdataset.PLAN_WINDOW", 8)
    for i in range(4):
        origin.put(f"s_{i}.tar", b"x" * 1024)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", "--eviction", "auto")
    urls = [f"pipe:curl -s -f {daemon.url}/web/s_{i}.tar" for i in range(4)]
    endless = ({"url": url} for url in itertools.cycle(urls))
    stage = prefetch_ahead(2)(endless)
    started = time.monotonic()
    handed = [next(stage)["url"] for _ in range(13)]
    assert time.monotonic() - started < 10
    assert handed == [urls[i % 4] for i in range(13)]
    plans = daemon.get_json("/_/status")[1]["cache"]["eviction"]["plans"]  # type: ignore[index]
    assert [p["length"] for p in plans] == [8]  # the window, not the endless list
    wait_for("prefetches", lambda: daemon.metric("shardcache_prefetch_completed_total") >= 3)


def test_read_ahead_asks_for_a_missing_neighbour_once_not_on_every_read(
    origin: OriginServer, start_daemon
) -> None:
    """New-user trial: shards numbered with gaps (s_050, s_100): every read of s_050, hits
    included, sent a HEAD for s_051 again. A key found missing is remembered for a while."""
    origin.put("train/s_050.tar", os.urandom(50_000))
    daemon = start_daemon({"web": origin.url}, "--readahead", "2")
    assert curl(f"{daemon.url}/web/train/s_050.tar").status == 200
    wait_for("the read-ahead's look for s_051", lambda: origin.not_found["train/s_051.tar"])
    _wait_idle(daemon, 0)
    for _ in range(4):
        assert curl(f"{daemon.url}/web/train/s_050.tar").status == 200
        time.sleep(0.3)  # a read-ahead it should not queue gets the time to start
        _wait_idle(daemon, 0)
    assert origin.not_found["train/s_051.tar"] == 1, origin.not_found
    assert origin.not_found["train/s_052.tar"] <= 1, origin.not_found
