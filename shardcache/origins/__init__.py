"""`make_origin(spec, timeouts)`: pick the backend for a URL scheme, importing it lazily so that
boto3 is loaded only when an S3 origin is configured."""

from __future__ import annotations

from dataclasses import dataclass

from shardcache.config import OriginSpec
from shardcache.errors import ConfigError
from shardcache.origins.base import ObjectInfo, Origin, OriginStream

__all__ = ["ObjectInfo", "Origin", "OriginStream", "Timeouts", "make_origin"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float


def make_origin(spec: OriginSpec, timeouts: Timeouts) -> Origin:
    """Return a backend for `spec`; raise ConfigError if its scheme or settings are unusable."""
    if spec.scheme == "s3":
        from shardcache.origins.s3 import S3Origin

        return S3Origin(spec, timeouts)
    if spec.scheme in ("http", "https"):
        from shardcache.origins.http import HttpOrigin

        return HttpOrigin(spec, timeouts)
    if spec.scheme == "file":
        from shardcache.origins.file import FileOrigin

        return FileOrigin(spec)
    raise ConfigError(f"origin {spec.name!r}: unknown scheme {spec.scheme!r}")
