"""`make_origin(spec, timeouts, receivers)`: the backend for one configured origin, from its URL
scheme, with its mirrors and tier (`cluster.FailoverOrigin`) around it; HTTP(S) and S3 backends
get the daemon's receiver pool; its caps are its gate's, in its `OriginTable` slot. Backends are
imported lazily, here because the composition root is the one place that knows every kind."""

from __future__ import annotations

import dataclasses

from shardcache.config import OriginSpec
from shardcache.errors import ConfigError
from shardcache.keys import TIER_REQUEST_HEADER
from shardcache.origins.base import Origin, Timeouts
from shardcache.origins.receivers import ReceiverPool

SHARDCACHE_REQUEST = (TIER_REQUEST_HEADER, "1")  # see `keys`; sent to members and mirrors


def make_origin(spec: OriginSpec, timeouts: Timeouts, receivers: ReceiverPool) -> Origin:
    """Return a backend for `spec`; raise ConfigError if its scheme or settings are unusable.

    An origin with mirrors or a tier is a `FailoverOrigin` over one backend per URL and
    member. Every HTTP(S) and S3 backend, tier
    members made later included, receives through `receivers`, which the caller owns."""
    if spec.has_upstreams:
        return _make_failover(spec, timeouts, receivers)
    return _make_one(spec, timeouts, receivers)


def _make_failover(spec: OriginSpec, timeouts: Timeouts, receivers: ReceiverPool) -> Origin:
    from shardcache.cluster.breaker import CircuitBreaker
    from shardcache.cluster.tier import TierMembers, Upstream, redact_url
    from shardcache.cluster.upstreams import FailoverOrigin

    def marked(url: str) -> OriginSpec:
        """A mirror that may be another shardcache is told the request comes from one."""
        if url == spec.url or not url.startswith(("http://", "https://")):
            return dataclasses.replace(spec, url=url)
        return dataclasses.replace(spec, url=url, headers=(*spec.headers, SHARDCACHE_REQUEST))

    chain = [
        Upstream(
            _make_one(marked(url), timeouts, receivers),
            CircuitBreaker(redact_url(url)),
            "home" if url == spec.url else "mirror",
        )
        for url in spec.urls
    ]
    tier = None
    if spec.tier or spec.tier_dns:
        served_as = spec.tier_origin or spec.name

        def make_member(base: str) -> Origin:
            # A member serves the origin at /NAME/; it gets none of the origin's headers,
            # which may hold the object store's credentials: only its own.
            headers = (*spec.tier_headers, SHARDCACHE_REQUEST)
            member = OriginSpec(spec.name, f"{base}/{served_as}", headers=headers)
            return _make_one(member, timeouts, receivers)

        tier = TierMembers(make_member, spec.tier, spec.tier_dns, spec.tier_refresh_s)
    return FailoverOrigin(spec.name, chain, tier, timeouts=timeouts)


def _make_one(spec: OriginSpec, timeouts: Timeouts, receivers: ReceiverPool) -> Origin:
    if spec.scheme == "s3":
        from shardcache.origins.s3 import S3Origin

        return S3Origin(spec, timeouts, receivers)
    if spec.scheme in ("http", "https"):
        from shardcache.origins.http import HttpOrigin

        return HttpOrigin(spec, timeouts, receivers)
    if spec.scheme == "file":
        from shardcache.origins.file import FileOrigin

        return FileOrigin(spec)
    raise ConfigError(f"origin {spec.name!r}: unknown scheme {spec.scheme!r}")
