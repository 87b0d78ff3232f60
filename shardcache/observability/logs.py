"""Log formatting: human text by default, one JSON object per line for log shippers, one access
line per request, and `FailureLog`, which keeps failures clients see at WARNING without a line
per request. Origin headers (tokens) are never passed to a logger; URLs in messages have any
userinfo and query-string credentials redacted; text from clients and origins is escaped."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import BaseRequest, StreamResponse

from shardcache.printable import CONTROL as _CONTROL
from shardcache.printable import CONTROL_BUT_NEWLINE as _CONTROL_BUT_NEWLINE
from shardcache.printable import escape_controls as escape_controls  # re-exported
from shardcache.printable import escaped as _escaped

_SECRETS = re.compile(
    # user:PASSWORD@host and :PASSWORD@host; a TOKEN@host (a token as the user name). Up to
    # the authority's last '@', as URL parsers split it (a raw '@' in a password).
    r"(?P<pre>://[^/@\s:]*:)[^/\s]+(?=@)"
    r"|(?P<scheme>://)[^/\s:]+(?=@)"
    # Query parameters that carry credentials, by their exact names: signed URLs (X-Amz-*,
    # X-Goog-*, Azure's sig), OAuth's tokens (RFC 6750), API keys, passwords and secrets. Not
    # words that merely contain one (an object key such as clips&keyframes=v2 stays readable).
    r"|(?P<query>[?&](?:x-amz-(?:signature|credential|security-token)|x-goog-(?:signature"
    r"|credential)|(?:access_|id_|refresh_)?token|sig|signature|(?:api[_-]?)?key|password"
    r"|passwd|pwd|(?:client_)?secret|auth)=)[^&\s]+"
    r"|(?P<bearer>\bBearer\s+)[^\s'\"\\]+",  # an Authorization header quoted in a message
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """Replace passwords in URLs, signature/token query values and bearer tokens with `***`."""
    return _SECRETS.sub(
        lambda m: (
            (m.group("pre") or m.group("scheme") or m.group("query") or m.group("bearer")) + "***"
        ),
        text,
    )


class TextFormatter(logging.Formatter):
    """One line per record, whatever the message quotes: keys, paths, headers and origin
    answers reach messages and arguments from outside, so control characters in the message
    are escaped here, at the one place every logger's records pass (root, aiohttp.access,
    shardcache.*), and no call site can forget. A traceback keeps the lines Python gives it;
    the text of its exceptions is escaped like a message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The default format's time, its date part made once a second: a hit's access line
        is written a few thousand times a second, and strftime was a third of its cost."""
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        return f"{self._second_text},{int(record.msecs):03d}"  # logging's default_msec_format

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)  # set by format() from msg % args
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return escape_traceback(super().formatException(ei), ei[1])

    def formatStack(self, stack_info: str) -> str:
        return _CONTROL_BUT_NEWLINE.sub(_escaped, stack_info)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        document.update(getattr(record, "fields", {}))
        if record.exc_info:
            document["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(document)


def configure(level: str, fmt: str) -> None:
    # No format here names the caller's file or line, thread or process: skip collecting
    # them (the logging HOWTO's "Optimization"), a third of an access line's cost.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(level.upper())
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, UnparseableRequests) for f in server_log.filters):
        server_log.addFilter(UnparseableRequests())
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class UnparseableRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a request line over 8 KiB, too many headers, TLS
    on the plain port) at ERROR with a traceback, then answers 400 itself. That is the client's
    error, not the daemon's: keep one escaped line at WARNING and drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            # aiohttp's message quotes the offending bytes, which can be any header, the admin
            # token's included: keep its first clause only ("Missing expected CR after …").
            reason = str(exc.message).split(":", 1)[0][:120]
            record.msg = "unparseable request from %s answered %d: %s"
            record.args = (remote, exc.code, escape_controls(reason))
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def escape_traceback(text: str, exc: BaseException | None) -> str:
    """A formatted traceback with the messages of `exc` and the exceptions chained to it (and
    their notes) escaped, and every other control character but the newlines between its
    lines: the lines are Python's, the messages may quote anything."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for quoted in (_text_of(exc), *getattr(exc, "__notes__", ())):
            if isinstance(quoted, str) and _CONTROL.search(quoted):
                text = text.replace(quoted, escape_controls(quoted))
        exc = exc.__cause__ or exc.__context__
    return _CONTROL_BUT_NEWLINE.sub(_escaped, text)


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__: the traceback module prints a placeholder instead
        return ""


# Asked every few seconds by probes, Prometheus and `stats --watch`: their access lines are
# debug-level unless they fail, or a 15 s scrape interval alone fills the journal.
ROUTINE_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/_/status"})
CLIENT_GONE = "shardcache.client_gone"  # request key: the client left before the response ended
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request", what log readers know
# Request key: the body bytes an object response sent (sendfile's included). aiohttp's
# `body_length` counts the status line and headers too (1,177,952 for a 1,177,600-byte shard).
BODY_BYTES = "shardcache.body_bytes"
_BODILESS_STATUSES = frozenset({204, 304})  # never a body (RFC 9110 §15.3.5, §15.4.5)


class AccessLogger(AbstractAccessLogger):
    """method, path, status, X-Shardcache result, body bytes, duration: one line per request.

    A response the client left before its end is logged as 499 with the bytes it got."""

    @property
    def enabled(self) -> bool:
        """aiohttp asks before each request: at WARNING and above there is no access line."""
        return self.logger.isEnabledFor(logging.DEBUG) or self.logger.isEnabledFor(logging.INFO)

    def log(self, request: BaseRequest, response: StreamResponse, time_s: float) -> None:
        is_routine = request.path in ROUTINE_PATHS and response.status < 400
        level = logging.DEBUG if is_routine else logging.INFO
        if not self.logger.isEnabledFor(level):
            return  # `--log-level warning`: nothing to build
        is_gone = request.get(CLIENT_GONE, False)
        log_access(
            self.logger,
            level,
            request.method,
            request.path,
            CLIENT_CLOSED_STATUS if is_gone else response.status,
            response.headers.get("X-Shardcache", "-"),
            _body_bytes(request, response),
            time_s,
            request.remote,
        )


def log_access(
    logger: logging.Logger,
    level: int,
    method: str,
    path: str,
    status: int,
    result: str,
    body_bytes: int,
    time_s: float,
    remote: str | None,
) -> None:
    """One access line (aiohttp's requests and the hit lane's alike): text, and the same as
    `fields` for the JSON format."""
    fields = {
        "method": method,
        "path": escape_controls(path),
        "status": status,
        "result": result,
        "bytes": body_bytes,
        "duration_s": round(time_s, 6),
        "remote": remote,
    }
    logger.log(
        level,
        "%s %s %d %s %d %.3fms",
        method,
        redact(str(fields["path"])),
        status,
        result,
        body_bytes,
        time_s * 1000,
        extra={"fields": fields},
    )


def _body_bytes(request: BaseRequest, response: StreamResponse) -> int:
    """The response's body bytes, without the status line and headers aiohttp counts."""
    sent = request.get(BODY_BYTES)
    if sent is not None:  # an object's body, counted as it was sent
        return int(sent)
    if request.method == "HEAD" or response.status in _BODILESS_STATUSES:
        return 0
    body = getattr(response, "body", None)  # a whole-body Response (JSON, metrics, a page)
    if isinstance(body, bytes | bytearray):
        return len(body)
    return response.body_length  # another stream: its headers counted too


FAILURE_LOG_INTERVAL_S = 60.0
RECENT_FAILURES = 20  # kept for `/_/status` (and the status page): the newest, bounded
RECENT_MESSAGE_CHARS = 500  # a failure's text as kept there (a key alone may be 1 KiB)


@dataclass(slots=True)
class _Window:
    opened_at: float
    timer: asyncio.TimerHandle | None
    suppressed: int = 0


class FailureLog:
    """Failures clients see (a 502, an aborted body), at WARNING without a line per request.

    Per origin and error kind: the first failure is a WARNING at once; the others in the next
    `interval_s` are DEBUG lines, and one WARNING when the interval ends says how many there
    were. So a run of failures is seen at `--log-level warning` at once, and costs at most two
    lines an interval; each one is counted in the metrics and has its access line. `close()`
    writes the summaries still open (at shutdown). The newest RECENT_FAILURES, suppressed ones
    too, are kept for `/_/status` (`recent()`), as raw text: whoever shows them escapes them.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = FAILURE_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self._recent: collections.deque[dict[str, object]] = collections.deque(
            maxlen=RECENT_FAILURES
        )

    def recent(self) -> list[dict[str, object]]:
        """The newest failures, oldest first: `at` (Unix time), `origin`, `kind`, `message`."""
        return list(self._recent)

    def failed(self, origin: str, kind: str, message: str, *args: object) -> None:
        """Log one failure of `kind` at `origin` (`message % args`, as a logger takes it)."""
        key = (origin, kind)
        now = self._clock()
        text = message % args if args else message
        if len(text) > RECENT_MESSAGE_CHARS:
            text = text[:RECENT_MESSAGE_CHARS] + "…"
        self._recent.append(
            {"at": round(self._wall_clock(), 3), "origin": origin, "kind": kind, "message": text}
        )
        window = self._windows.get(key)
        if window is not None and now - window.opened_at >= self._interval_s:
            self._summarize(key)  # its timer is late (or there is no event loop)
            window = None
        if window is None:
            self._windows[key] = _Window(now, self._call_later(key))
            self._log.warning(message, *args)
        else:
            window.suppressed += 1
            self._log.debug(message, *args)

    def close(self) -> None:
        """Write the summaries of the intervals still open and stop their timers."""
        for key in list(self._windows):
            self._summarize(key)

    def _call_later(self, key: tuple[str, str]) -> asyncio.TimerHandle | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the next failure or close() summarizes
            return None
        return loop.call_later(self._interval_s, self._summarize, key)

    def _summarize(self, key: tuple[str, str]) -> None:
        window = self._windows.pop(key, None)
        if window is None:
            return
        if window.timer is not None:
            window.timer.cancel()
        if window.suppressed:
            self._log.warning(
                "origin %s: %d more %s failures in the last %.0f s (each logged at DEBUG; "
                "counted in shardcache_origin_errors_total and shardcache_requests_total)",
                key[0],
                window.suppressed,
                key[1],
                self._clock() - window.opened_at,
            )
