"""Who may do what: the admin token that guards the `/_/` endpoints (and shard reads, if asked),
an S3 read signed by one of `s3_keys` standing for it, Basic for the status page's reads, and
the refusal of cross-site changes and, on loopback, of foreign `Host` names. The token is
compared as a SHA-256 digest in constant time, and never logged or echoed."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
from collections.abc import Mapping

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
ADMIN_PREFIX = "/_/"
SCHEME = "bearer"
PAGE_PATHS = frozenset({"/_/", "/_/status"})  # where a browser may present Basic credentials
BASIC_METHODS = frozenset({"GET", "HEAD"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


class AccessPolicy:
    """Decides whether a request's `Authorization` header lets it reach a path."""

    def __init__(
        self,
        token: str | None,
        require_for_reads: bool = False,
        loopback_only: bool = False,
        s3_keys: Mapping[str, str] | None = None,
    ) -> None:
        self._digest = _digest(token) if token is not None else None
        self.require_for_reads = require_for_reads and token is not None
        self.loopback_only = loopback_only  # listening on loopback: refuse foreign Host names
        # S3 access key id -> secret: a read signed by one (SigV4) needs no token.
        self.s3_keys: Mapping[str, str] = dict(s3_keys or {})

    @property
    def is_enabled(self) -> bool:
        return self._digest is not None

    def is_protected(self, path: str) -> bool:
        if self._digest is None or path in OPEN_PATHS:
            return False
        return path.startswith(ADMIN_PREFIX) or self.require_for_reads

    def is_authorized(self, authorization: str | None, *, allow_basic: bool = False) -> bool:
        """Whether `authorization` is `Bearer <the token>` (the scheme is case-insensitive),
        or with `allow_basic` (`takes_basic`) `Basic` with the token as the password."""
        if self._digest is None:
            return True
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() == "basic" and allow_basic:
            presented = _basic_password(presented.strip())
        elif scheme.lower() != SCHEME:
            presented = ""  # still compared, so a missing header costs the same as a wrong one
        return hmac.compare_digest(_digest(presented.strip()), self._digest)

    @staticmethod
    def takes_basic(method: str, path: str) -> bool:
        """Whether a request may present the token as Basic credentials (the status page)."""
        return method in BASIC_METHODS and path in PAGE_PATHS


def is_cross_site(
    method: str, path: str, host: str | None, origin: str | None, fetch_site: str | None
) -> bool:
    """Whether a request that changes something under `/_/` came from another site's page:
    `Sec-Fetch-Site` says so (`cross-site`, `same-site`), or its `Origin` is not the daemon's
    own scheme-less `host` (RFC 6454: `null` from a sandboxed page or a file is never ours)."""
    if method in SAFE_METHODS or not path.startswith(ADMIN_PREFIX):
        return False
    if fetch_site is not None and fetch_site.strip().lower() in ("cross-site", "same-site"):
        return True
    if origin is None:
        return False
    _, _, authority = origin.strip().partition("://")
    return not authority or host is None or authority.lower() != host.strip().lower()


@functools.lru_cache(maxsize=64)  # every request asks; a client sends the same few names
def is_foreign_host(host: str | None) -> bool:
    """Whether a request's `Host` names something other than this machine's loopback (a
    rebound DNS name); a request with no `Host` (HTTP/1.0) is not refused for it."""
    if host is None:
        return False
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:8470
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761 §6.3: always loopback
        return False
    labels = name.split(".")
    if len(labels) > 4:  # BUCKET.127.0.0.1, an S3 client's virtual host (no public name ends so)
        name = ".".join(labels[-4:])
    try:
        return not ipaddress.ip_address(name).is_loopback
    except ValueError:
        return True


def _basic_password(credentials: str) -> str:
    """The password of RFC 7617 `user-id:password` credentials; "" when they do not decode."""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[2]
