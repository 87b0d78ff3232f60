"""Talking to a running daemon from a training job: local URLs, prefetch, status.

Stdlib only (it runs in dataloader workers). The address is an argument or `SHARDCACHE_URL`
(default `http://127.0.0.1:8470`); an admin token from `SHARDCACHE_ADMIN_TOKEN` or
`SHARDCACHE_ADMIN_TOKEN_FILE` is sent with every request."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from shardcache.printable import printable

DEFAULT_DAEMON_URL = "http://127.0.0.1:8470"
_TIMEOUT_S = 10.0  # each socket operation (connect, a read)
DEADLINE_S = 30.0  # a whole request: a daemon answering a byte at a time holds no command long
MAX_ANSWER_BYTES = 32 << 20  # the most of an answer read (an `ls` page is well under 1 MiB)
_ERROR_BODY_BYTES = 64 << 10  # the most of an error's body read for its message
_CHUNK_BYTES = 64 << 10
_TOKEN_FILE_CHARS = 4096  # a token file is a line; anything longer is not one
_DETAIL_CHARS = 300  # of a daemon's message quoted in an error line
_URL_IN_PIPE = re.compile(r"(https?://\S+)")
# Kept as is in a daemon URL: path separators and brace-pattern syntax ({000..099}, {a,b}).
_SAFE_IN_KEY = "/{},~"


class ClientError(Exception):
    """The daemon could not be reached, or it refused the request (the message says why)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status of a refusal; None: not reached


def daemon_url(daemon: str | None = None, configured: str | None = None) -> str:
    """The daemon to talk to: `daemon` (a --daemon flag), else `SHARDCACHE_URL`, else the
    address a config file it was given listens on (`configured`), else the default."""
    chosen = daemon or os.environ.get("SHARDCACHE_URL") or configured or DEFAULT_DAEMON_URL
    return chosen.rstrip("/")


def admin_token() -> str | None:
    """The daemon's admin token from the environment, or None when none is set."""
    token = os.environ.get("SHARDCACHE_ADMIN_TOKEN", "").strip()
    where = "SHARDCACHE_ADMIN_TOKEN"
    if not token:
        path = os.environ.get("SHARDCACHE_ADMIN_TOKEN_FILE", "").strip()
        if not path:
            return None
        where = "SHARDCACHE_ADMIN_TOKEN_FILE"
        try:
            with open(path, encoding="ascii") as stream:
                token = stream.read(_TOKEN_FILE_CHARS + 1).strip()  # /dev/zero: not forever
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not ASCII text"
            raise ClientError(f"{where}: cannot read {path}: {reason}") from None
    if not token or len(token) > _TOKEN_FILE_CHARS or not all(33 <= ord(c) < 127 for c in token):
        # Never echoed: a header library's error would quote it.
        raise ClientError(f"{where}: not a token (printable ASCII without spaces)")
    return token


def _request(method: str, url: str, body: object | None = None) -> Any:
    """The daemon's JSON answer to `method url`. Every way talking to it can fail (refused,
    not reachable, an answer that is not HTTP, not JSON, too large, too deep, too slow) raises
    ClientError with one line saying which: nothing from urllib, http.client or json leaks."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    token = admin_token()
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
    except ValueError:
        raise ClientError(f"{printable(url)[:_DETAIL_CHARS]} is not an http:// URL") from None
    deadline = _Deadline(DEADLINE_S)
    opener = urllib.request.build_opener(
        _WatchedHTTPHandler(deadline), _WatchedHTTPSHandler(deadline), _RefusedRedirect()
    )
    try:
        deadline.start()
        with opener.open(request, timeout=_TIMEOUT_S) as response:
            raw = _read_capped(response, url, deadline)
        return json.loads(raw or b"null")
    except urllib.error.HTTPError as exc:
        raise _refusal(method, url, exc, token is not None) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        if deadline.expired:
            raise ClientError(_too_slow(url)) from None
        if isinstance(exc, http.client.HTTPException) and not isinstance(exc, OSError):
            # A status line, header or body http.client cannot read (RemoteDisconnected, an
            # OSError too, is a daemon gone, below).
            raise not_understood(url, f"not HTTP ({_summary(exc)})") from None
        reason = getattr(exc, "reason", None) or exc
        detail = printable(reason)[:_DETAIL_CHARS]
        raise ClientError(f"cannot reach the shardcache daemon at {url}: {detail}") from None
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
        raise not_understood(url, _summary(exc)) from None
    finally:
        deadline.cancel()


def _request_object(method: str, url: str, body: object | None = None) -> dict[str, Any]:
    """`_request`, for the routes that answer a JSON object (every route of the daemon)."""
    return answer_object(_request(method, url, body), url)


def not_understood(url: str, detail: object) -> ClientError:
    """The error for an answer from the daemon at `url` that is not what this client expects
    (another program on its port, another version, a broken proxy): one line, `detail` escaped
    and cut short."""
    return ClientError(
        f"the daemon at {url} answered something this shardcache does not understand: "
        f"{printable(detail)[:_DETAIL_CHARS]}"
    )


@contextlib.contextmanager
def reading_answer(url: str) -> Iterator[None]:
    """Around code that reads a daemon's answer (indexing, formatting): a key missing or a
    value of the wrong type there is the daemon's answer at fault, raised as `not_understood`."""
    try:
        yield
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        ArithmeticError,
        RecursionError,
    ) as exc:
        raise not_understood(url, _summary(exc)) from None


def answer_object(answer: Any, url: str) -> dict[str, Any]:
    """`answer` when it is a JSON object, else `not_understood`."""
    if not isinstance(answer, dict):
        raise not_understood(url, f"expected a JSON object, got {type(answer).__name__}")
    return answer


def _summary(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} in it" if exc.args else "a field is missing"
    if isinstance(exc, RecursionError):
        return "nested too deep"
    return f"{exc.__class__.__name__}: {exc}"


def _refusal(method: str, url: str, exc: urllib.error.HTTPError, has_token: bool) -> ClientError:
    """The ClientError for an HTTP error status: the daemon's `{"error": ...}` when it sent
    one (read up to a bound), else the reason phrase."""
    message: object = exc.reason
    try:
        error = json.loads(exc.read(_ERROR_BODY_BYTES))["error"]
        if isinstance(error, str):
            message = error
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, OSError):
        pass  # no JSON error in the body: the reason phrase says what there is
    except http.client.HTTPException:
        pass  # the body ended early: likewise
    text = printable(message)[:_DETAIL_CHARS]
    if exc.code == 401:
        hint = "a different" if has_token else "no"
        text = (
            f"{text} (this process has {hint} token; set SHARDCACHE_ADMIN_TOKEN or "
            "SHARDCACHE_ADMIN_TOKEN_FILE to the daemon's)"
        )
    elif 300 <= exc.code < 400:  # the daemon never redirects: the token is not sent on
        text = f"{text} (a redirect: not followed)"
    return ClientError(f"{method} {url}: {exc.code} {text}", exc.code)


def _read_capped(response: Any, url: str, deadline: _Deadline) -> bytes:
    """The body of `response`, read a socket read at a time: at most MAX_ANSWER_BYTES (a
    daemon's largest answer, a page of `ls`, is far smaller), whole, before the deadline."""
    declared = response.length  # None: no Content-Length
    if declared is not None and declared > MAX_ANSWER_BYTES:
        raise not_understood(url, f"an answer of {declared} bytes (the most read: 32 MiB)")
    chunks, size = [], 0
    while chunk := response.read1(_CHUNK_BYTES):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise not_understood(url, "an answer over 32 MiB")
        chunks.append(chunk)
    if deadline.expired:
        raise ClientError(_too_slow(url))
    if response.length:  # the connection closed before the declared length arrived
        raise ClientError(
            f"cannot read the answer of the shardcache daemon at {url}: it ended after "
            f"{size} of {declared} bytes"
        )
    return b"".join(chunks)


def _too_slow(url: str) -> str:
    return f"the shardcache daemon at {url} did not answer in {DEADLINE_S:g} s"


class _Deadline:
    """Ends a request that outlasts its time: the socket timeout bounds each read, not a
    daemon that sends a byte every few seconds. At the deadline a timer thread shuts the
    request's socket down, which wakes the read blocked on it (with end-of-file)."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        """Shut `sock` down at the deadline (now, if it has passed)."""
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the reader: nothing to wake
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self._deadline.watch(self.sock)


class _WatchedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self._deadline.watch(self.sock)


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_WatchedHTTPConnection, deadline=self._deadline)
        return self.do_open(connection, req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_WatchedHTTPSConnection, deadline=self._deadline)
        return self.do_open(connection, req)


class _RefusedRedirect(urllib.request.HTTPRedirectHandler):
    """The daemon never redirects; following one would send the admin token elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def origins(daemon: str | None = None) -> dict[str, str]:
    """Return the running daemon's origins: name → URL."""
    url = daemon_url(daemon) + "/_/origins"
    found = _request_object("GET", url).get("origins")
    if not isinstance(found, dict) or not all(
        isinstance(name, str) and isinstance(base, str) for name, base in found.items()
    ):
        raise not_understood(url, "no `origins` of NAME: URL strings in it")
    return dict(found)


def map_url(url: str, origin_urls: Mapping[str, str], daemon: str) -> str:
    """Return the daemon URL serving `url`, its key percent-encoded; brace patterns intact.

    `url` is an origin URL (`s3://bucket/prefix/x.tar`, `https://…` as a URL, encoded), a path
    under a `file://` origin's root (`/data/shards/x.tar`), a local path `/NAME/KEY` of a
    configured origin, or already a daemon URL. Keys of the others are taken as written.
    Raises ClientError when no origin covers `url`.
    """
    if url.startswith(daemon + "/"):
        return url
    best: tuple[int, str, str] | None = None
    for name, base in origin_urls.items():
        base = base.rstrip("/")
        prefixes = [base]
        if base.startswith("file://"):
            prefixes.append(base.removeprefix("file://"))  # the root as a plain path
        for prefix in prefixes:
            if url.startswith(prefix + "/") and (best is None or len(prefix) > best[0]):
                key = url[len(prefix) + 1 :]
                best = (len(prefix), name, unquote(key) if prefix.startswith("http") else key)
    if best is None and url.startswith("/"):
        name, _, key = url[1:].partition("/")
        if name in origin_urls and key:
            best = (0, name, key)
    if best is None:
        covered = ", ".join(f"{n}={u}" for n, u in origin_urls.items()) or "none"
        raise ClientError(f"no configured origin covers {url} (origins: {covered})")
    return f"{daemon}/{best[1]}/{quote(best[2], safe=_SAFE_IN_KEY)}"


def local_url(url: str, daemon: str | None = None) -> str:
    """Return the daemon URL for `url`, asking the running daemon for its origins."""
    base = daemon_url(daemon)
    return map_url(url, origins(base), base)


def local_path(url: str, daemon: str | None = None) -> str:
    """Return `/NAME/KEY` (the key decoded) for a daemon URL, a `pipe:curl … URL` string, or a
    local path."""
    base = daemon_url(daemon)
    url = url_in(url)
    if url.startswith(base + "/"):
        return unquote(url[len(base) :])
    if url.startswith("/"):
        return url
    raise ClientError(f"{url} is not a URL of the shardcache daemon at {base}")


def url_in(shard: str) -> str:
    """The URL a WebDataset shard string names: itself, or the one inside `pipe:curl … URL`."""
    if shard.startswith("pipe:"):
        match = _URL_IN_PIPE.search(shard)
        return match.group(1) if match else shard
    return shard


def daemon_of(url: str) -> str | None:
    """The `scheme://host:port` of an http(s) URL (a daemon URL names its daemon), or None."""
    parts = urlsplit(url_in(url))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def prefetch(urls: Iterable[str], daemon: str | None = None, warm: bool = False) -> dict[str, Any]:
    """Queue shards (daemon URLs, `/NAME/KEY` paths, pipe: strings or origin URLs; patterns
    allowed) in the order given. Returns `{"queued", "cached", "in_flight", "batch"}`.

    By default they are look-ahead for a loader: pinned until read, within the daemon's
    look-ahead budget. `warm=True` fills the cache before a run instead: nothing pinned, no
    budget to wait for."""
    base = daemon_url(daemon)
    paths = []
    known: dict[str, str] | None = None
    for url in urls:
        try:
            paths.append(local_path(url, base))
        except ClientError:
            known = known if known is not None else origins(base)
            paths.append(local_path(map_url(url, known, base), base))
    body: dict[str, Any] = {"urls": paths, "warm": True} if warm else {"urls": paths}
    result = _request_object("POST", base + "/_/prefetch", body)
    return result


def post_plan(
    job: str, epoch: int, urls: Iterable[str], daemon: str | None = None
) -> dict[str, Any]:
    """Tell the daemon the order job `job` reads shards in (daemon URLs or `/NAME/KEY` paths;
    the rest of this epoch, optionally then the next): eviction keeps what it reads soonest.
    Replaces the job's previous plan. Returns `{"job", "epoch", "keys"}`."""
    base = daemon_url(daemon)
    paths = [local_path(url, base) for url in urls]
    body = {"job": job, "epoch": epoch, "urls": paths}
    result = _request_object("POST", base + "/_/plan", body)
    return result


def cancel_prefetch(batch: int | None = None, daemon: str | None = None) -> dict[str, Any]:
    """Drop what is still queued of `batch` (or of everything) and release the look-ahead
    budget its prefetched shards hold. Returns `{"dropped", "released_bytes"}`."""
    query = f"?batch={batch}" if batch is not None else ""
    result = _request_object("DELETE", daemon_url(daemon) + "/_/prefetch" + query)
    return result


def prefetch_status(batch: int | None = None, daemon: str | None = None) -> dict[str, Any]:
    query = f"?batch={batch}" if batch is not None else ""
    result = _request_object("GET", daemon_url(daemon) + "/_/prefetch" + query)
    return result


def verify(daemon: str | None = None) -> dict[str, Any]:
    """Ask the daemon to check every cached entry now (or join the check under way). Returns
    `{"joined", "verify": TALLY}`; poll `verify_status` until the tally `is_finished`."""
    result = _request_object("POST", daemon_url(daemon) + "/_/verify", {})
    return result


def verify_status(daemon: str | None = None) -> dict[str, Any]:
    """The latest check `verify` started: `{"verify": TALLY or None}`."""
    result = _request_object("GET", daemon_url(daemon) + "/_/verify")
    return result


def status(daemon: str | None = None) -> dict[str, Any]:
    """Return the daemon's `/_/status` document."""
    result = _request_object("GET", daemon_url(daemon) + "/_/status")
    return result


def cached(
    origin: str, pattern: str = "*", after: str = "", limit: int = 1000, daemon: str | None = None
) -> dict[str, Any]:
    """One page of what the daemon caches for `origin` whose keys match the glob `pattern`:
    `{"entries": [...], "next": CURSOR or None}`; pass `after=next` for the page after."""
    query = urlencode({"origin": origin, "pattern": pattern, "limit": limit} | _after(after))
    result = _request_object("GET", daemon_url(daemon) + "/_/cache?" + query)
    return result


def purge_cached(
    origin: str, pattern: str, after: str = "", daemon: str | None = None
) -> dict[str, Any]:
    """Purge one page of `cached(origin, pattern)`'s entries, and the fills of matching keys in
    flight: `{"deleted": [KEY, ...], "deleted_bytes", "fills_not_kept": [KEY, ...], "next"}`;
    call again with `after=next` until `next` is None."""
    query = urlencode({"origin": origin, "pattern": pattern} | _after(after))
    result = _request_object("DELETE", daemon_url(daemon) + "/_/cache?" + query)
    return result


def _after(after: str) -> dict[str, str]:
    return {"after": after} if after else {}
