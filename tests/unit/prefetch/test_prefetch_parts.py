"""Pure parts of prefetch: numbering, brace patterns, request bodies, URL mapping."""

from __future__ import annotations

import pytest

from shardcache.errors import BadRequest, InvalidKey
from shardcache.loader.client import ClientError, local_path, map_url
from shardcache.patterns import expand, next_keys
from shardcache.serving.targets import parse_targets


@pytest.mark.parametrize(
    ("key", "count", "expected"),
    [
        ("a/shards_000123.tar", 2, ["a/shards_000124.tar", "a/shards_000125.tar"]),
        ("train-00042-of-01024.tar", 1, ["train-00043-of-01024.tar"]),
        ("train-01022-of-01024.tar", 5, ["train-01023-of-01024.tar"]),
        ("s_998.tar", 2, ["s_999.tar", "s_1000.tar"]),
        ("s_0998.tar", 3, ["s_0999.tar", "s_1000.tar", "s_1001.tar"]),
        ("s_0998.tar", 9003, ["s_0999.tar", *(f"s_{n}.tar" for n in range(1000, 10000))]),
        ("v2/shard.tar", 2, []),
        ("x_7.tar", 0, []),
    ],
)
def test_next_keys(key: str, count: int, expected: list[str]) -> None:
    assert next_keys(key, count) == expected


def test_expand() -> None:
    assert expand("s_{000..002}.tar") == ["s_000.tar", "s_001.tar", "s_002.tar"]
    assert expand("{a,b}/x") == ["a/x", "b/x"]
    assert expand("plain.tar") == ["plain.tar"]
    with pytest.raises(InvalidKey):
        expand("s_{000..002.tar")


def test_parse_targets_keeps_order_and_expands() -> None:
    body = {"urls": ["/web/b_{1..2}.tar"], "origin": "lake", "keys": ["a.tar"]}
    assert parse_targets(body, {"web", "lake"}) == [
        ("web", "b_1.tar"),
        ("web", "b_2.tar"),
        ("lake", "a.tar"),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "expected"),
        ({"urls": [1]}, "list of strings"),
        ({"urls": ["/x/a"]}, "no origin"),
        ({"keys": ["a"]}, "needs"),
        ({"urls": ["/web/a//b"]}, "empty"),
    ],
)
def test_parse_targets_errors(body: object, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_targets(body, {"web"})


def test_map_url_picks_the_longest_covering_origin() -> None:
    origins = {"all": "s3://bucket", "train": "s3://bucket/train", "web": "https://h/p/"}
    daemon = "http://127.0.0.1:8470"
    assert (
        map_url("s3://bucket/train/s_{0..9}.tar", origins, daemon)
        == f"{daemon}/train/s_{{0..9}}.tar"
    )
    assert map_url("s3://bucket/val/x.tar", origins, daemon) == f"{daemon}/all/val/x.tar"
    assert map_url("https://h/p/x.tar", origins, daemon) == f"{daemon}/web/x.tar"
    assert map_url("/web/x.tar", origins, daemon) == f"{daemon}/web/x.tar"
    # Keys come out percent-encoded: https URLs are taken as encoded, s3 keys as written.
    assert map_url("https://h/p/a%20b.tar", origins, daemon) == f"{daemon}/web/a%20b.tar"
    assert map_url("s3://bucket/val/a b é.tar", origins, daemon) == (
        f"{daemon}/all/val/a%20b%20%C3%A9.tar"
    )
    with pytest.raises(ClientError, match="no configured origin covers"):
        map_url("s3://bucketX/a.tar", origins, daemon)


def test_local_path_accepts_pipe_strings() -> None:
    daemon = "http://127.0.0.1:8470"
    assert local_path(f"pipe:curl -s -f {daemon}/web/a.tar", daemon) == "/web/a.tar"
    assert local_path("/web/a.tar", daemon) == "/web/a.tar"
    assert local_path(f"pipe:curl -s -f {daemon}/web/a%20b.tar", daemon) == "/web/a b.tar"
    with pytest.raises(ClientError):
        local_path("https://elsewhere/a.tar", daemon)


def test_a_missing_key_is_remembered_for_a_while_and_the_memory_is_bounded() -> None:
    from shardcache.prefetch.missing import MissingKeys

    now = [100.0]
    missing = MissingKeys(lambda: now[0], ttl_s=60.0, limit=3)
    missing.add("web", "s_051.tar")
    assert missing.has("web", "s_051.tar") and not missing.has("other", "s_051.tar")
    now[0] += 59.9
    assert missing.has("web", "s_051.tar")
    now[0] += 0.2
    assert not missing.has("web", "s_051.tar")  # forgotten: the dataset may have gained it
    for n in range(5):
        missing.add("web", f"k{n}")
    assert len(missing) == 3 and not missing.has("web", "k0") and missing.has("web", "k4")
