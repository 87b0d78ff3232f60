"""Talking to a running daemon from a training job: local URLs, prefetch, status.

Stdlib only: this runs inside dataloader workers, installed without the daemon's dependencies
(`pip install shardcache`, no extra). The daemon's address is
an argument or `SHARDCACHE_URL`, default `http://127.0.0.1:8470`. A daemon with an admin token
gets it from `SHARDCACHE_ADMIN_TOKEN` or the file named by `SHARDCACHE_ADMIN_TOKEN_FILE`, sent
as `Authorization: Bearer …` with every request this module makes.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

DEFAULT_DAEMON_URL = "http://127.0.0.1:8470"
_TIMEOUT_S = 10.0
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
                token = stream.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not ASCII text"
            raise ClientError(f"{where}: cannot read {path}: {reason}") from None
    if not token or not all(33 <= ord(c) < 127 for c in token):
        # Never echoed: a header library's error would quote it.
        raise ClientError(f"{where}: not a token (printable ASCII without spaces)")
    return token


def _request(method: str, url: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    token = admin_token()
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        if exc.code == 401:
            hint = "a different" if token else "no"
            message = (
                f"{message} (this process has {hint} token; set SHARDCACHE_ADMIN_TOKEN or "
                "SHARDCACHE_ADMIN_TOKEN_FILE to the daemon's)"
            )
        raise ClientError(f"{method} {url}: {exc.code} {message}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ClientError(f"cannot reach the shardcache daemon at {url}: {reason}") from None


def origins(daemon: str | None = None) -> dict[str, str]:
    """Return the running daemon's origins: name → URL."""
    document = _request("GET", daemon_url(daemon) + "/_/origins")
    return dict(document["origins"])


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
    result: dict[str, Any] = _request("POST", base + "/_/prefetch", body)
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
    result: dict[str, Any] = _request("POST", base + "/_/plan", body)
    return result


def cancel_prefetch(batch: int | None = None, daemon: str | None = None) -> dict[str, Any]:
    """Drop what is still queued of `batch` (or of everything, which also releases the
    look-ahead budget). Returns `{"dropped", "released_bytes"}`."""
    query = f"?batch={batch}" if batch is not None else ""
    result: dict[str, Any] = _request("DELETE", daemon_url(daemon) + "/_/prefetch" + query)
    return result


def prefetch_status(batch: int | None = None, daemon: str | None = None) -> dict[str, Any]:
    query = f"?batch={batch}" if batch is not None else ""
    result: dict[str, Any] = _request("GET", daemon_url(daemon) + "/_/prefetch" + query)
    return result


def verify(daemon: str | None = None) -> dict[str, Any]:
    """Ask the daemon to check every cached entry now (or join the check under way). Returns
    `{"joined", "verify": TALLY}`; poll `verify_status` until the tally `is_finished`."""
    result: dict[str, Any] = _request("POST", daemon_url(daemon) + "/_/verify", {})
    return result


def verify_status(daemon: str | None = None) -> dict[str, Any]:
    """The latest check `verify` started: `{"verify": TALLY or None}`."""
    result: dict[str, Any] = _request("GET", daemon_url(daemon) + "/_/verify")
    return result


def status(daemon: str | None = None) -> dict[str, Any]:
    """Return the daemon's `/_/status` document."""
    result: dict[str, Any] = _request("GET", daemon_url(daemon) + "/_/status")
    return result


def cached(
    origin: str, pattern: str = "*", after: str = "", limit: int = 1000, daemon: str | None = None
) -> dict[str, Any]:
    """One page of what the daemon caches for `origin` whose keys match the glob `pattern`:
    `{"entries": [...], "next": CURSOR or None}`; pass `after=next` for the page after."""
    query = urlencode({"origin": origin, "pattern": pattern, "limit": limit} | _after(after))
    result: dict[str, Any] = _request("GET", daemon_url(daemon) + "/_/cache?" + query)
    return result


def purge_cached(
    origin: str, pattern: str, after: str = "", daemon: str | None = None
) -> dict[str, Any]:
    """Purge one page of `cached(origin, pattern)`'s entries: `{"deleted": [KEY, ...],
    "deleted_bytes", "next"}`; call again with `after=next` until `next` is None."""
    query = urlencode({"origin": origin, "pattern": pattern} | _after(after))
    result: dict[str, Any] = _request("DELETE", daemon_url(daemon) + "/_/cache?" + query)
    return result


def _after(after: str) -> dict[str, str]:
    return {"after": after} if after else {}
