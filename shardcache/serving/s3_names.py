"""S3 names to origins (pure): a client's `s3://BUCKET/KEY` is served by the origin named BUCKET,
else by the S3 origin of BUCKET whose prefix is the longest that starts KEY, under the rest of
KEY; `s3://B/P/KEY` and `/NAME/KEY` are one entry. Virtual-hosted buckets only from loopback
names (`BUCKET.localhost`, `BUCKET.127.0.0.1`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from shardcache.config import OriginSpec


@dataclass(frozen=True, slots=True)
class View:
    """How one origin shows inside a client's bucket: its keys are the bucket's keys under
    `prefix` ("" or "datasets/laion/", with its slash), with the prefix taken off."""

    origin: str
    prefix: str = ""

    def key_of(self, bucket_key: str) -> str:
        return bucket_key[len(self.prefix) :]


def views_of(bucket: str, names: Collection[str], specs: Mapping[str, OriginSpec]) -> list[View]:
    """The origins a client's `bucket` shows, longest prefix first (empty: no such bucket)."""
    if bucket in names:
        return [View(bucket)]
    found = []
    for name in sorted(specs):
        spec = specs[name]
        if spec.scheme != "s3" or name not in names:
            continue
        parts = urlsplit(spec.url)
        if parts.netloc != bucket:
            continue
        prefix = parts.path.strip("/")
        found.append(View(name, f"{prefix}/" if prefix else ""))
    found.sort(key=lambda view: len(view.prefix), reverse=True)  # stable: by name within
    return found


def object_view(views: list[View], key: str) -> View | None:
    """The view that serves bucket key `key`: the longest prefix that starts it."""
    for view in views:
        if key.startswith(view.prefix) and len(key) > len(view.prefix):
            return view
    return None


def buckets_of(names: Collection[str], specs: Mapping[str, OriginSpec]) -> list[str]:
    """Every bucket a client can address: each origin's name, and each S3 origin's bucket."""
    found = set(names)
    for name, spec in specs.items():
        if spec.scheme == "s3" and name in names:
            found.add(urlsplit(spec.url).netloc)
    return sorted(found)


def bucket_of_host(host: str | None) -> str | None:
    """The bucket a virtual-hosted request names in `Host` (`BUCKET.localhost:8470`,
    `BUCKET.127.0.0.1`), or None for a plain name (`localhost`, `127.0.0.1`, `[::1]`)."""
    if not host or "." not in host:
        return None
    name = host.strip().lower()
    if name.startswith("["):
        return None
    name = name.rpartition(":")[0] if name.count(":") == 1 else name
    name = name.rstrip(".")
    if name.endswith(".localhost"):
        bucket = name[: -len(".localhost")]
        return bucket or None
    labels = name.split(".")
    if len(labels) < 5:
        return None
    try:
        is_loopback = ipaddress.IPv4Address(".".join(labels[-4:])).is_loopback
    except ValueError:
        return None
    return ".".join(labels[:-4]) if is_loopback else None
