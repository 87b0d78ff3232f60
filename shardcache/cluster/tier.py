"""`TierMembers`: the shardcache tier daemons an origin's keys are shared out over, a fixed
list or one DNS name resolved again and again; and `Upstream`, one place an origin's objects
can come from (a backend and its breaker), which `upstreams.FailoverOrigin` asks in order.

It knows nothing of the cache nor of how a member is built (the daemon's factory is passed in).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from shardcache.cluster.breaker import CircuitBreaker
from shardcache.config.origins import origin_default
from shardcache.origins.base import Origin

log = logging.getLogger("shardcache.origin")
RETIRE_S = 600.0  # a member gone from DNS keeps its connections this long for requests under way
Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(slots=True)
class Upstream:
    """One place the origin's objects can come from: a backend and its breaker."""

    origin: Origin
    breaker: CircuitBreaker
    role: str  # "tier", "mirror" or "home" (the last URL, which names objects in the cache)


async def resolve_all(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (a Kubernetes headless Service: one per ready pod)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class TierMembers:
    """The tier daemons an origin's keys are shared out over: a fixed list of base URLs, or one
    URL whose host name is resolved to all its addresses, again every `refresh_s`.

    A resolution that fails or finds nobody keeps the members found before (a DNS blip must not
    send every key to the object store at once); members that leave the answer are dropped
    with their connections, new ones start with a closed breaker.
    """

    def __init__(
        self,
        make_member: Callable[[str], Origin],
        urls: Sequence[str] = (),
        dns_url: str | None = None,
        refresh_s: float = origin_default("tier_refresh"),
        resolver: Resolver = resolve_all,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make_member = make_member
        self._dns_url = dns_url
        self._refresh_s = refresh_s
        self._resolver = resolver
        self._clock = clock
        self._members: dict[str, Upstream] = {}
        self._resolved_at = -float("inf")
        self._refreshing: asyncio.Task[None] | None = None
        self._resolved_once = False
        self._retired: list[tuple[float, Origin]] = []  # (when it left, its backend)
        for url in urls:
            self._add(url.rstrip("/"))

    def _add(self, url: str) -> None:
        breaker = CircuitBreaker(redact_url(url))
        self._members[url] = Upstream(self._make_member(url), breaker, "tier")

    @property
    def members(self) -> dict[str, Upstream]:
        return self._members

    async def current(self) -> dict[str, Upstream]:
        """The members now. Until the first resolution of a DNS tier has ended, every caller
        waits for it (none goes round the tier for want of members); later ones refresh it in
        the background when it is older than `refresh_s`."""
        if self._dns_url is None:
            return self._members
        stale = self._clock() - self._resolved_at >= self._refresh_s
        if stale and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.create_task(self.refresh())
        if not self._resolved_once and self._refreshing is not None:
            await asyncio.shield(self._refreshing)
        return self._members

    async def refresh(self) -> None:
        """Resolve the tier's host name again and adopt the addresses it names. A member that
        left is closed RETIRE_S later: requests already on their way to it may still use it."""
        assert self._dns_url is not None
        parts = urlsplit(self._dns_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._resolved_at = self._clock()
        try:
            addresses = await self._resolver(parts.hostname or "", port)
        except (OSError, UnicodeError) as exc:
            log.warning(
                "tier %s: cannot resolve (%s); keeping %d members",
                parts.hostname,
                exc,
                len(self._members),
            )
            return
        finally:
            self._resolved_once = True
        await self._close_retired()
        if not addresses:
            return
        wanted = {_member_url(parts.scheme, address, port, parts.path) for address in addresses}
        if wanted == set(self._members):
            return
        for url in set(self._members) - wanted:
            self._retired.append((self._clock(), self._members.pop(url).origin))
        for url in sorted(wanted - set(self._members)):
            self._add(url)
        log.info("tier %s: %d members: %s", parts.hostname, len(wanted), ", ".join(sorted(wanted)))

    async def _close_retired(self, everyone: bool = False) -> None:
        keep = []
        for retired_at, origin in self._retired:
            if everyone or self._clock() - retired_at >= RETIRE_S:
                await origin.aclose()
            else:
                keep.append((retired_at, origin))
        self._retired = keep

    async def aclose(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refreshing
        await self._close_retired(everyone=True)
        for upstream in self._members.values():
            await upstream.origin.aclose()


def redact_url(url: str) -> str:
    """`url` without userinfo or query, to name an upstream in logs, metrics and status."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _member_url(scheme: str, address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return urlunsplit((scheme, f"{host}:{port}", path.rstrip("/"), "", ""))
