"""S3 names to origins (pure): which origin serves `s3://BUCKET/KEY`, virtual hosts, and the
listing parameters' checks."""

from __future__ import annotations

import pytest

from shardcache.config import OriginSpec
from shardcache.errors import BadRequest
from shardcache.origins.listing import ListVersion
from shardcache.serving.access import is_foreign_host
from shardcache.serving.s3_api import parse_list_params
from shardcache.serving.s3_names import View, bucket_of_host, buckets_of, object_view, views_of

SPECS = {
    "lake": OriginSpec("lake", "s3://my-bucket/datasets/laion"),
    "all": OriginSpec("all", "s3://my-bucket"),
    "coco": OriginSpec("coco", "s3://my-bucket/datasets/laion/coco"),
    "files": OriginSpec("files", "file:///data/files"),
    "my-bucket-2": OriginSpec("my-bucket-2", "s3://other"),
}
NAMES = set(SPECS)


def test_the_longest_prefix_that_starts_the_key_serves_it() -> None:
    views = views_of("my-bucket", NAMES, SPECS)
    assert [v.origin for v in views] == ["coco", "lake", "all"]
    assert object_view(views, "datasets/laion/shards_000001.tar") == View("lake", "datasets/laion/")
    assert object_view(views, "datasets/laion/coco/1.tar") == View("coco", "datasets/laion/coco/")
    assert object_view(views, "datasets/laionX/1.tar") == View("all", "")
    assert View("lake", "datasets/laion/").key_of("datasets/laion/a/b.tar") == "a/b.tar"


def test_an_origins_name_wins_over_another_origins_bucket() -> None:
    specs = {**SPECS, "other": OriginSpec("other", "file:///srv")}
    assert views_of("other", set(specs), specs) == [View("other")]
    assert views_of("files", NAMES, SPECS) == [View("files")]
    assert views_of("nope", NAMES, SPECS) == []
    assert object_view([View("lake", "datasets/laion/")], "datasets/laion/") is None


def test_buckets_are_origin_names_and_s3_buckets() -> None:
    assert buckets_of(NAMES, SPECS) == sorted({*NAMES, "my-bucket", "other"})


@pytest.mark.parametrize(
    ("host", "bucket"),
    [
        ("my-bucket.localhost:8470", "my-bucket"),
        ("My-Bucket.LOCALHOST", "my-bucket"),
        ("a.b.localhost:1", "a.b"),
        ("my-bucket.127.0.0.1:8470", "my-bucket"),
        ("localhost:8470", None),
        ("127.0.0.1:8470", None),
        ("[::1]:8470", None),
        ("my-bucket.example.com", None),
        ("my-bucket.10.0.0.1", None),
        (None, None),
    ],
)
def test_virtual_hosted_buckets_on_loopback_names_only(
    host: str | None, bucket: str | None
) -> None:
    assert bucket_of_host(host) == bucket


def test_the_host_guard_takes_a_bucket_on_a_loopback_address_only() -> None:
    assert not is_foreign_host("my-bucket.127.0.0.1:8470")
    assert not is_foreign_host("my-bucket.localhost:8470")
    assert is_foreign_host("my-bucket.example.com")
    assert is_foreign_host("127.0.0.1.example.com")
    assert is_foreign_host("my-bucket.10.0.0.1")


def test_list_parameters() -> None:
    params = parse_list_params({"list-type": "2", "max-keys": "5000", "encoding-type": "url"})
    assert (params.version, params.max_keys, params.encodes) == (ListVersion.V2, 1000, True)
    v1 = parse_list_params({"marker": "a/b", "prefix": "a/"})
    assert (v1.version, v1.start_after, v1.prefix, v1.token) == (ListVersion.V1, "a/b", "a/", None)
    for bad in (
        {"max-keys": "-1"},
        {"max-keys": "1e3"},
        {"max-keys": "٣"},  # a digit, but not ASCII
        {"list-type": "1"},
        {"encoding-type": "json"},
        {"list-type": "2", "continuation-token": ""},
        {"prefix": "x" * 1025},
        {"delimiter": "\x00"},
        {"marker": "é" * 513},
    ):
        with pytest.raises(BadRequest):
            parse_list_params(bad)
