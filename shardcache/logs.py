"""Log formatting: human text by default, one JSON object per line for log shippers, and one
access line per request. Origin headers (tokens) are never passed to a logger; URLs in messages
have any userinfo and query-string credentials redacted."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import BaseRequest, StreamResponse

_SECRETS = re.compile(
    r"(?P<pre>://[^/@\s:]+:)[^/@\s]+(?=@)"  # user:PASSWORD@host
    r"|(?P<query>[?&](?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|token|sig)=)"
    r"[^&\s]+"
    r"|(?P<bearer>\bBearer\s+)[^\s'\"\\]+",  # an Authorization header quoted in a message
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """Replace passwords in URLs, signature/token query values and bearer tokens with `***`."""
    return _SECRETS.sub(
        lambda m: (m.group("pre") or m.group("query") or m.group("bearer")) + "***", text
    )


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


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


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """`text` with control characters written as \\xNN: a path like `/a%0d%0aFAKE LINE`
    decodes to a CR LF, which must not forge a line in the log."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# Asked every few seconds by probes, Prometheus and `stats --watch`: their access lines are
# debug-level unless they fail, or a 15 s scrape interval alone fills the journal.
ROUTINE_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/_/status"})
CLIENT_GONE = "shardcache.client_gone"  # request key: the client left before the response ended
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request", what log readers know


class AccessLogger(AbstractAccessLogger):
    """method, path, status, X-Shardcache result, body bytes, duration: one line per request.

    A response the client left before its end is logged as 499 with the bytes it got."""

    def log(self, request: BaseRequest, response: StreamResponse, time_s: float) -> None:
        is_gone = request.get(CLIENT_GONE, False)
        fields = {
            "method": request.method,
            "path": escape_controls(request.path),
            "status": CLIENT_CLOSED_STATUS if is_gone else response.status,
            "result": response.headers.get("X-Shardcache", "-"),
            "bytes": response.body_length,
            "duration_s": round(time_s, 6),
            "remote": request.remote,
        }
        is_routine = request.path in ROUTINE_PATHS and response.status < 400
        self.logger.log(
            logging.DEBUG if is_routine else logging.INFO,
            "%s %s %d %s %d %.3fms",
            fields["method"],
            redact(str(fields["path"])),
            fields["status"],
            fields["result"],
            fields["bytes"],
            time_s * 1000,
            extra={"fields": fields},
        )
