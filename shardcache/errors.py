"""The whole shardcache exception tree, each class carrying its HTTP status and metric label.

    class                               status  kind
    ShardcacheError                     500     internal     the base, never raised itself
    ├── ConfigError                     500     config       a bad setting; the CLI prints one line
    ├── BadRequest                      400     bad_request  a malformed request body
    ├── InvalidKey                      400     invalid_key  a malformed key or origin name
    ├── Unauthorized                    401     unauthorized no or a wrong admin token
    │   └── SignatureRefused            403     unauthorized a client's SigV4 signature did not hold
    ├── CrossSite                       403     cross_site   an admin change a web page sent
    ├── RequestTimeout                  408     client_timeout  the client sent its body too slowly
    ├── UnknownOrigin                   404     unknown_origin
    ├── NotCached                       404     not_cached   purging a key that is not cached
    ├── PlansOff                        409     plans_off    a plan posted to --eviction lru
    ├── RangeNotSatisfiable             416     range
    ├── QueueFull                       429     queue_full   the prefetch queue is at its bound
    ├── ShuttingDown                    503     shutdown
    ├── FillAbandoned                   499     abandoned    every reader of a fill left
    ├── TierLoop                        508     tier_loop    asked as a tier member, has a tier
    ├── NotSupported                    501     not_supported  an operation an origin cannot do
    ├── CacheError                      503     cache        the local store failed (disk full, I/O)
    │   ├── CacheFull                   503     cache        pins, reservations hold all
    │   │   └── NotAdmitted             503     cache        admission spares the victims
    │   └── CacheInUse                  503     cache        a daemon holds its lock
    └── OriginError                     502     origin
        ├── OriginNotFound              404     not_found
        │   └── BucketNotFound          404     not_found    an S3 origin's bucket does not exist
        ├── OriginTimeout               504     timeout      connect or read timed out (stalled)
        │   └── OriginTooSlow           504     timeout      a body below --origin-min-speed
        ├── OriginUnavailable           502     unavailable  refused, reset, 5xx
        │   ├── OriginThrottled         502     throttled    429 / 503 SlowDown; passed on as 503
        │   ├── OriginShed              503     busy         not sent: its turn or place too far off
        │   ├── OriginHeadUnsupported   502     unavailable  405/501 to HEAD: no checksums that way
        │   ├── OriginNotResumable      502     unavailable  failed mid-body, no ETag to resume by
        │   ├── OriginRedirected        502     unavailable  a 3xx the origin may not follow
        │   ├── OriginRefused           502     unavailable  a 4xx: asking again gets the same
        │   ├── OriginUntrusted         502     tls          its TLS certificate did not verify
        │   └── OriginDenied            502     denied       our credentials were refused
        ├── OriginChanged               502     changed      the ETag moved under a resumed fill
        └── IntegrityError              502     integrity    length or checksum did not verify

A class marked `[in MODULE]` is defined in that module but drawn here, with the whole tree;
every other class is defined below. `tests/unit/test_errors.py` checks this drawing against the
code: each class, its parent, its status and its kind.

Adapters translate vendor exceptions at their edge (`raise OriginTimeout(...) from exc`); nothing
from botocore or aiohttp.client leaks past `origins/`. `server.py` turns these into JSON errors.
"""

from __future__ import annotations


class ShardcacheError(Exception):
    """Base of every error shardcache raises on purpose."""

    status: int = 500
    kind: str = "internal"


class ConfigError(ShardcacheError):
    """A setting is invalid; the message names the setting and where it came from."""

    kind = "config"


class BadRequest(ShardcacheError):
    status = 400
    kind = "bad_request"


class PlansOff(ShardcacheError):
    """A well-formed plan that nothing would use: the daemon runs `--eviction lru`."""

    status = 409
    kind = "plans_off"


class InvalidKey(ShardcacheError):
    status = 400
    kind = "invalid_key"


class Unauthorized(ShardcacheError):
    status = 401
    kind = "unauthorized"


class SignatureRefused(Unauthorized):
    """An S3 client's SigV4 signature that does not let it read (`serving.s3_signatures`): S3's
    error `code` (`SignatureDoesNotMatch`, `RequestTimeTooSkewed`, …), its status (403, or 400
    for a malformed one) and the fields S3's `<Error>` carries for it. Never a secret."""

    status = 403
    kind = "unauthorized"

    def __init__(
        self, code: str, message: str, status: int = 403, fields: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.fields = fields or {}


class CrossSite(ShardcacheError):
    status = 403
    kind = "cross_site"


class RequestTimeout(ShardcacheError):
    status = 408
    kind = "client_timeout"


class UnknownOrigin(ShardcacheError):
    status = 404
    kind = "unknown_origin"


class NotCached(ShardcacheError):
    status = 404
    kind = "not_cached"


class RangeNotSatisfiable(ShardcacheError):
    """The Range header asks for bytes past the end; carries the length for Content-Range."""

    status = 416
    kind = "range"

    def __init__(self, size_bytes: int) -> None:
        super().__init__(f"range not satisfiable for an object of {size_bytes} bytes")
        self.size_bytes = size_bytes


class QueueFull(ShardcacheError):
    """The prefetch queue holds its maximum: try again later (429 with Retry-After)."""

    status = 429
    kind = "queue_full"


class ShuttingDown(ShardcacheError):
    status = 503
    kind = "shutdown"


class FillAbandoned(ShardcacheError):
    """A fill stopped because every reader left and nothing wants it cached for later
    (`Fill.let_go`): no one is left to be told, 499 as nginx logs a client gone."""

    status = 499
    kind = "abandoned"


class TierLoop(ShardcacheError):
    """A node daemon asked this daemon as a tier member, and this daemon's origin has a tier
    of its own: asking it could send the request round the tier forever (HTTP caches guard
    the same way with `Via`). 508 Loop Detected: the node asks its next upstream."""

    status = 508
    kind = "tier_loop"


class NotSupported(ShardcacheError):
    """An operation this origin (or the daemon) does not offer: listing an HTTP origin, an
    S3 request other than a read."""

    status = 501
    kind = "not_supported"


class CacheError(ShardcacheError):
    """The local store failed (full, read-only or deleted directory, a broken index): the
    environment's fault, not a bug, so 503; reads stream through uncached meanwhile."""

    status = 503
    kind = "cache"


class CacheFull(CacheError):
    """No room can be made: reservations and pinned entries hold the rest of the capacity."""


class NotAdmitted(CacheFull):
    """Admission spares the entries eviction would take: the fill streams through uncached."""


class CacheInUse(CacheError):
    """Another process (a running daemon) holds the directory's lock."""


class OriginError(ShardcacheError):
    """The origin failed; `is_retryable` says whether a fill may try again."""

    status = 502
    kind = "origin"
    is_retryable = True


class OriginNotFound(OriginError):
    status = 404
    kind = "not_found"
    is_retryable = False


class BucketNotFound(OriginNotFound):
    """The S3 bucket itself is missing, not just the key (`shardcache check` names it)."""


class OriginTimeout(OriginError):
    status = 504
    kind = "timeout"


class OriginTooSlow(OriginTimeout):
    """A body arrives, but slower than the speed floor over a read-timeout window (a drip
    below the read timeout): the upstream counts as failing, as curl's --speed-limit does."""


class OriginUnavailable(OriginError):
    kind = "unavailable"


class OriginThrottled(OriginUnavailable):
    """The origin refused the request as one too many (429, 503 SlowDown): retried after its
    `Retry-After` hint if it gave one, and fewer requests are sent to it for a while."""

    kind = "throttled"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OriginShed(OriginUnavailable):
    """The request was not sent: its turn at the origin's gate (its cap, or the pace its
    throttling allows), or a place in this daemon's own share for the origin, is further off
    than a request may wait (the read timeout). Shed with 503 and Retry-After rather than
    queued without bound, and not retried here (a retry would only queue it again).

    `kind` says why: "throttled" when the origin's throttling set the pace, passed on as such
    so that a daemon reading through this one as a tier slows down too; "busy" for an
    operator's cap or our own share. `is_local`: our own share (its threads) was full, which
    says nothing of the upstream: no breaker hears of it."""

    status = 503
    kind = "busy"
    is_retryable = False

    def __init__(
        self, message: str, retry_after_s: float, kind: str = "busy", is_local: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.kind = kind
        self.is_local = is_local


class OriginHeadUnsupported(OriginUnavailable):
    """The origin answers HEAD with 405 or 501: a definite answer, not a transient failure,
    so a fill checks such an origin's objects by length (and validators) only."""

    is_retryable = False


class OriginNotResumable(OriginUnavailable):
    """A body failed part-way and the origin gives no ETag: resuming could splice two
    versions, so the fill fails (the next request starts afresh)."""

    is_retryable = False


class OriginRedirected(OriginUnavailable):
    """The origin answered 3xx and the redirect may not be followed (another host, or the
    origin does not allow redirects): asking again gets the same answer."""

    is_retryable = False


class OriginRefused(OriginUnavailable):
    """The origin refused the request itself (a 4xx such as 400, 414, a name too long for
    its filesystem): asking again would get the same answer, so it is not retried."""

    is_retryable = False


class OriginUntrusted(OriginUnavailable):
    """An https:// origin's certificate did not verify against the trusted CAs: asking again
    meets the same certificate, and reading it unverified (or over plain HTTP) is never done."""

    kind = "tls"
    is_retryable = False


class OriginDenied(OriginUnavailable):
    """The origin refused our credentials; retrying will not help."""

    kind = "denied"
    is_retryable = False


class OriginChanged(OriginError):
    kind = "changed"
    is_retryable = False


class IntegrityError(OriginError):
    kind = "integrity"
    is_retryable = False
