"""`shardcache stats`: the `/_/status` document as a short table for people (pure)."""

from __future__ import annotations

from typing import Any

from shardcache.printable import printable
from shardcache.units import format_size


def _concurrency(prefetch: dict[str, Any]) -> str:
    """`N at once (auto)`: the tuned limit, or a fixed one; older daemons say neither mode."""
    mode = prefetch.get("concurrency_mode")
    return f"{prefetch.get('concurrency', '?')} at once" + (f" ({mode})" if mode else "")


def _fields(document: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in document.items())


def _scrub_line(scrub: dict[str, Any] | None) -> str:
    """The background scrub: its rate, what it checked and found (older daemons: none)."""
    if not scrub:
        return "scrub          -"
    if not scrub["is_on"]:
        return "scrub          off (--scrub-rate 0)"
    last = scrub.get("last_full_pass_s")
    return (
        f"scrub          {format_size(scrub['rate_bytes_per_s'])}/s, "
        f"{format_size(scrub['checked_bytes'])} checked, {scrub['corrupt']} damaged and dropped"
        + ("" if last is None else f", last full pass took {last:.0f} s")
    )


def _waiting_lines(prefetch: dict[str, Any]) -> list[str]:
    """While look-ahead waits: why, and which jobs hold the budget (older daemons: no line)."""
    waiting = prefetch.get("waiting_for")
    if not waiting:
        return []
    return [f"  waiting for  {waiting}"]


def _receivers_line(receivers: dict[str, Any] | None) -> str:
    """The receiving processes: how many, busy with what, replaced how often."""
    if not receivers:
        return "receivers      -"
    return (
        f"receivers      {receivers['alive']} of {receivers['size']} processes, "
        f"{receivers['in_flight']} origin requests in flight, "
        f"{receivers['replaced']} died and were replaced"
    )


def format_status(document: dict[str, Any]) -> str:
    """Render `/_/status` as a short table for people, control characters escaped.

    Raises KeyError, TypeError or ValueError for a document not shaped as `/_/status` is."""

    def percent(value: float | None) -> str:
        return "-" if value is None else f"{value * 100:.1f}%"

    cache, prefetch, ratio = document["cache"], document["prefetch"], document["hit_ratio"]
    lines = [
        f"shardcache {document['version']} on {document['listen']}, "
        f"up {document['uptime_s']:.0f} s",
        f"hit ratio      {percent(ratio['requests'])} of requests, "
        f"{percent(ratio['bytes'])} of bytes",
        _origin_read_line(document),
        f"cache          {format_size(cache.get('entry_bytes', cache['size_bytes']))} in "
        f"{cache['entries']} {'entry' if cache['entries'] == 1 else 'entries'} of "
        f"{format_size(cache['capacity_bytes'])} "
        f"(+{format_size(cache['size_bytes'] - cache.get('entry_bytes', 0))} index: "
        f"{percent(cache['use_ratio'])} used), {cache['evictions']} evictions",
        _eviction_line(cache.get("eviction")),
        f"loader stalled {document.get('loader_stall_s', 0):.2f} s waiting for bytes not on disk "
        f"({document['client_wait_s']:.2f} s added up over every stream)",
        f"prefetch       {prefetch['pending']} pending, {prefetch['in_flight']} in flight, "
        f"{prefetch['fetched']} fetched "
        f"(+{prefetch['done'] - prefetch['fetched']} found cached or being read), "
        f"{prefetch['failed']} failed, "
        f"{format_size(prefetch['unread_bytes'])} unread, "
        f"{_concurrency(prefetch)}",
        *_waiting_lines(prefetch),
        _scrub_line(document.get("scrub")),
        _receivers_line(document.get("receivers")),
        "",
        f"{'origin':<16}{'hit':>8}{'miss':>8}{'coal.':>8}{'error':>8}"
        f"{'served':>12}{'of it miss':>12}{'read origin':>13}  origin errors",
    ]
    for name, origin in document["origins"].items():
        requests, served = origin["requests"], origin["bytes"]
        errors = ", ".join(f"{k} {v}" for k, v in origin["origin_errors"].items()) or "none"
        read = origin.get("origin_bytes")  # older daemons: not reported
        lines.append(
            f"{name:<16}{requests['hit']:>8}{requests['miss']:>8}{requests['coalesced']:>8}"
            f"{requests['error']:>8}{format_size(served['cache'] + served['origin']):>12}"
            f"{format_size(served['origin']):>12}"
            f"{'-' if read is None else format_size(read):>13}  {errors}"
        )
        for upstream in origin.get("upstreams", []):  # tier members, mirrors, home
            state = upstream["state"]
            if state != "up":
                failures = upstream["failures"]
                state += f", {failures} failure{'' if failures == 1 else 's'}: "
                state += str(upstream["last_error"])
            lines.append(f"  {upstream['role']:<8}{upstream['url']}  {state}")
        for unusable in origin.get("unusable_checksums", []):
            lines.append(f"  checksum set aside: {_fields(unusable)}")
        gate = _gate_line(origin.get("gate"))
        if gate:
            lines.append(f"  gate    {gate}")
    # Names, URLs and errors are the daemon's (an upstream's last error quotes an origin):
    # each line escaped on its own, so a newline or an ESC inside one shows as \x0a, \x1b.
    return "\n".join(printable(line) for line in lines)


def _gate_line(gate: dict[str, Any] | None) -> str:
    """The origin's gate: its caps, and what holds, waits or was turned away there; empty for
    an origin with no cap that has shed nothing (most of them)."""
    if not gate:
        return ""
    caps = []
    if gate.get("max_requests_per_second"):
        caps.append(f"cap {gate['max_requests_per_second']:g}/s")
    if gate.get("max_requests"):
        caps.append(f"{gate['max_requests']} at once")
    counts = {
        "in use": gate.get("in_use") or 0,
        "waiting": (gate.get("waiting") or 0) + (gate.get("waiting_for_place") or 0),
        "shed": gate.get("shed") or 0,
        "abandoned": gate.get("abandoned") or 0,
    }
    if not caps and not any(counts.values()):
        return ""
    return f"{', '.join(caps) or 'no cap'}; " + ", ".join(f"{v} {k}" for k, v in counts.items())


def _origin_read_line(document: dict[str, Any]) -> str:
    """Bytes read from the origins beside bytes served: a prefetched shard is a hit when it
    is read, yet came from the origin; with a dataset larger than the cache, the hit ratio
    can read 97% while most of the dataset is fetched again every epoch."""
    read = document.get("origin_bytes")
    if read is None:
        return "from origins   - (this daemon does not report it)"
    served = sum(document["bytes"].values())
    share = f"{read / served * 100:.1f}%" if served else "-"
    return (
        f"from origins   {format_size(read)} read for {format_size(served)}"
        f" served ({share} of the bytes served)"
    )


def _eviction_line(eviction: dict[str, Any] | None) -> str:
    if not eviction:
        return "eviction       -"
    line = f"eviction       {eviction['policy']}"
    if eviction["policy"] != "lru":
        line += (
            f": {eviction['bypassed']} misses streamed through to keep what is in use, "
            f"{format_size(eviction['transient_bytes'])} of look-ahead held "
            f"(read once then kept {eviction['transient_kept']}, "
            f"dropped {eviction['transient_dropped']})"
        )
        if not eviction["resident_set_serving"]:
            line += "; cached shards no longer read: evictable"
    plans = eviction.get("plans") or []
    if plans:
        line += f"; {len(plans)} loader plan{'s' if len(plans) > 1 else ''} active"
    return line
