"""The `/_/status` document: the figures a person wants first, as one JSON object (pure).

Built from a `Snapshot` of the metrics, so `/_/status`, `shardcache stats` and Prometheus can
never disagree about what happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Counter values by label: requests[(origin, result)], response_bytes[(origin, source)],
    origin_errors[(origin, kind)]; per origin: retries, body bytes read from it (fills and
    pass-through alike: what the origin sent, beside `response_bytes`, what clients got),
    throttled answers and the request limit while it throttles; plus scrape-time state."""

    requests: dict[tuple[str, str], float] = field(default_factory=dict)
    response_bytes: dict[tuple[str, str], float] = field(default_factory=dict)
    origin_errors: dict[tuple[str, str], float] = field(default_factory=dict)
    origin_retries: dict[str, float] = field(default_factory=dict)
    origin_bytes: dict[str, float] = field(default_factory=dict)
    origin_throttled: dict[str, float] = field(default_factory=dict)
    origin_request_limit: dict[str, float] = field(default_factory=dict)
    client_wait_s: dict[str, float] = field(default_factory=dict)
    loader_stall_s: dict[str, float] = field(default_factory=dict)
    evictions: float = 0


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def build_status(
    *,
    version: str,
    uptime_s: float,
    listen: str,
    snapshot: Snapshot,
    cache: dict[str, Any],
    prefetch: dict[str, Any],
    origins: dict[str, str],
    upstreams: dict[str, list[dict[str, object]]] | None = None,
    unusable_checksums: dict[str, list[dict[str, str]]] | None = None,
    gates: dict[str, dict[str, object]] | None = None,
    scrub: dict[str, Any] | None = None,
    receivers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the status document; ratios are None until there is traffic. An origin's
    `unusable_checksums` (only when there are some) names the kinds of checksum it publishes
    but gets wrong, set aside (`checksum_trust`)."""
    per_origin: dict[str, dict[str, Any]] = {}
    for name, url in origins.items():
        requests = {
            r: int(snapshot.requests.get((name, r), 0))
            for r in ("hit", "miss", "coalesced", "error")
        }
        served = {s: int(snapshot.response_bytes.get((name, s), 0)) for s in ("cache", "origin")}
        errors = {k: int(v) for (o, k), v in snapshot.origin_errors.items() if o == name and v}
        per_origin[name] = {
            "url": url,
            "requests": requests,
            "bytes": served,
            "origin_errors": errors,
            "origin_retries": int(snapshot.origin_retries.get(name, 0)),
            "origin_bytes": int(snapshot.origin_bytes.get(name, 0)),
            "throttled": int(snapshot.origin_throttled.get(name, 0)),
            "request_limit": int(snapshot.origin_request_limit.get(name, 0)),
            "client_wait_s": round(snapshot.client_wait_s.get(name, 0.0), 3),
            "loader_stall_s": round(snapshot.loader_stall_s.get(name, 0.0), 3),
        }
        if upstreams and name in upstreams:  # tier members, mirrors and home, with health
            per_origin[name]["upstreams"] = upstreams[name]
        if unusable_checksums and unusable_checksums.get(name):
            per_origin[name]["unusable_checksums"] = unusable_checksums[name]
        if gates and name in gates:  # its caps, and what waits at its gate
            per_origin[name]["gate"] = gates[name]
    total_requests = {
        r: sum(o["requests"][r] for o in per_origin.values())
        for r in ("hit", "miss", "coalesced", "error")
    }
    total_bytes = {s: sum(o["bytes"][s] for o in per_origin.values()) for s in ("cache", "origin")}
    return {
        "version": version,
        "uptime_s": round(uptime_s, 3),
        "listen": listen,
        "hit_ratio": {
            "requests": _ratio(total_requests["hit"], sum(total_requests.values())),
            "bytes": _ratio(total_bytes["cache"], sum(total_bytes.values())),
        },
        "requests": total_requests,
        "bytes": total_bytes,
        # What the origins sent (fills and pass-through): `bytes.origin` is only what clients
        # were served while it streamed through; a cache too small re-reads the dataset here.
        "origin_bytes": sum(o["origin_bytes"] for o in per_origin.values()),
        "client_wait_s": round(sum(snapshot.client_wait_s.values()), 3),
        # Per origin; over origins the sum bounds the union from above.
        "loader_stall_s": round(sum(snapshot.loader_stall_s.values()), 3),
        "cache": {
            **cache,
            "evictions": int(snapshot.evictions),
            "use_ratio": _ratio(cache["size_bytes"], cache["capacity_bytes"]),
        },
        "prefetch": prefetch,
        "origins": per_origin,
        **({"scrub": scrub} if scrub is not None else {}),
        **({"receivers": receivers} if receivers is not None else {}),
    }
