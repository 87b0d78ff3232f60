"""Hostile requests, one table, against one running daemon (issue 10): every row is sent as raw
bytes (no client library normalises its path), and each must be answered with its 4xx (or a
legitimate 2xx) quickly, never a 5xx, never a byte from outside an origin, without growing the
daemon's memory, and the daemon must keep serving. The module ends with checks over the whole
run: the daemon's log, what the HTTP origin and another host were asked, and the cache.

The daemon has an HTTP origin `web` at a path prefix (`/data`) of a test server that also holds
a secret outside that prefix, and a `file://` origin `files` whose root holds a real shard and
links: out of the root (to a file, to a directory, relative, absolute, a chain) and within it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import posixpath
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import pytest
from aiohttp import web

from shardcache.loader.sample import write_shard
from tests.daemon_process import Daemon
from tests.integration.helpers import wait_for
from tests.origin_server import OriginServer

SECRET_MARKER = b"SHARDCACHE-HOSTILE-SECRET-8d2f61"
SECRET = (SECRET_MARKER + b": outside every origin, never to be served\n") * 64
PASSWD_MARKER = b"root:x:0:"  # the first line of /etc/passwd
ANSWER_WITHIN_S = 0.1
RSS_GROWTH_LIMIT = 50 << 20
WEB_PREFIX = "/data"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- the daemon and its origins ------------------------------------------------------------


@dataclass
class RecordingOrigin(OriginServer):
    """The test origin, also recording the raw path of every request, known key or not."""

    seen: list[str] = field(default_factory=list)

    def _app(self) -> web.Application:
        app = super()._app()

        @web.middleware
        async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
            self.seen.append(request.raw_path)
            return await handler(request)

        app.middlewares.append(record)
        return app


@dataclass(repr=False)
class Target:
    daemon: Daemon
    web: RecordingOrigin  # the HTTP origin, served under WEB_PREFIX
    elsewhere: RecordingOrigin  # another host, which `web` redirects to
    root: Path  # the file origin's root
    shard: bytes  # the real shard, at `/web/s_000.tar` and `/files/real/shard.tar`

    def __repr__(self) -> str:  # failure reports print it: not the shard's bytes
        return f"Target(daemon on port {self.daemon.port})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis's printer would list a dataclass's fields


def build_file_root(base: Path) -> tuple[Path, bytes]:
    """Write the secret outside `base/root`, a shard and links inside it; return (root, shard)."""
    (base / "secret").write_bytes(SECRET)
    (base / "outside").mkdir()
    (base / "outside" / "secret.tar").write_bytes(SECRET)
    root = base / "root"
    (root / "real").mkdir(parents=True)
    (root / "sub").mkdir()
    write_shard(root / "real" / "shard.tar", 0, 8, 4096, seed=7)
    links = {
        "abs.tar": str(base / "secret"),  # absolute, to a file outside
        "passwd": "/etc/passwd",  # absolute, to a system file
        "dirlink": str(base / "outside"),  # a directory outside
        "rel.tar": "../secret",  # relative, one level up
        "sub/rel.tar": "../../outside/secret.tar",  # relative, two levels up
        "up": "..",  # the root's parent, as a directory
        "chain1.tar": "sub/chain2.tar",  # a chain: inside, inside, then out
        "sub/chain2.tar": "../chain3.tar",
        "chain3.tar": str(base / "secret"),
        "loop1": "loop2",  # a loop
        "loop2": "loop1",
        "dangling.tar": "nowhere.tar",
        "inside.tar": "real/shard.tar",  # stays inside the root: served
        "indir": "real",  # a directory inside the root: served through
    }
    for link, target in links.items():
        os.symlink(target, root / link)
    os.mkfifo(root / "fifo.tar")  # opening it must neither hang nor serve
    return root, (root / "real" / "shard.tar").read_bytes()


@contextlib.contextmanager
def running_target(base: Path) -> Iterator[Target]:
    """Start the origins and one daemon under `base`; stop them after, and the daemon, stopped
    with SIGTERM, must exit 0."""
    root, shard = build_file_root(base)
    elsewhere = RecordingOrigin()
    elsewhere.start()
    elsewhere.put("secret", SECRET)
    origin = RecordingOrigin()
    origin.start()
    origin.put(WEB_PREFIX[1:] + "/s_000.tar", shard)
    origin.put(WEB_PREFIX[1:] + "/redir.tar", b"not this", redirect_to=f"{elsewhere.url}/secret")
    for outside in ("outside/secret.tar", "secret", "etc/passwd"):  # beyond the prefix
        origin.put(outside, SECRET)
    try:
        with pytest.MonkeyPatch.context() as env:  # the readiness probe must not use a proxy
            for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
                env.delenv(name, raising=False)
            daemon = Daemon(
                base / "cache",
                {"web": origin.url + WEB_PREFIX, "files": f"file://{root}"},
                "--readahead",
                "0",
            )
        try:
            yield Target(daemon, origin, elsewhere, root, shard)
        finally:
            running = daemon.process.poll() is None
            code = daemon.stop()
        assert running and code == 0, f"daemon exited {code}:\n{daemon.log()[-5000:]}"
    finally:
        origin.stop()
        elsewhere.stop()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One daemon for the whole table."""
    with running_target(tmp_path_factory.mktemp("hostile")) as running:
        yield running


# -- raw requests ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # names lowercased
    body: bytes
    elapsed_s: float


def raw_request(
    port: int,
    method: str,
    target: str | bytes,
    headers: tuple[tuple[str | bytes, str | bytes | None], ...] = (),
    body: bytes | None = None,
    *,
    framing: bool = True,
    timeout_s: float = 10,
) -> Answer:
    """Send one request exactly as given (request-target and headers as latin-1 bytes, not
    normalised) with `Connection: close`, and read the whole answer.

    A header whose value is None is sent as its name alone (a line without a colon). `framing`
    adds a Content-Length for `body`; without it the headers frame the body (or not).
    Raises OSError (a timeout too) or http.client.HTTPException when no whole answer arrives.
    """

    def as_bytes(text: str | bytes) -> bytes:
        return text if isinstance(text, bytes) else text.encode("latin-1")

    lines = [
        as_bytes(method) + b" " + as_bytes(target) + b" HTTP/1.1",
        b"Host: 127.0.0.1:%d" % port,
        b"Connection: close",
    ]
    lines += [
        as_bytes(name) if value is None else as_bytes(name) + b": " + as_bytes(value)
        for name, value in headers
    ]
    if body is not None and framing:
        lines.append(b"Content-Length: %d" % len(body))
    message = b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(message)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before reading all of it: the answer is still there
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        data = response.read()
        headers_seen = {name.lower(): value for name, value in response.getheaders()}
        status = response.status
        response.close()
    return Answer(status, headers_seen, data, time.monotonic() - began)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def assert_sound(answer: Answer, allowed: frozenset[int], label: str) -> None:
    """The properties every answer to a hostile request must have, whatever its status."""
    said = f"{label}: {answer.status} {answer.body[:300]!r}"
    assert answer.status < 500 or answer.status in allowed, f"server error: {said}"
    assert answer.status in allowed, f"not one of {sorted(allowed)}: {said}"
    exposed = answer.body + repr(answer.headers).encode()
    assert SECRET_MARKER not in exposed, f"{label}: the secret was served"
    assert PASSWD_MARKER not in exposed, f"{label}: /etc/passwd was served"
    is_json = answer.headers.get("content-type", "").startswith("application/json")
    if answer.status >= 400 and is_json and answer.body:  # a HEAD answer has no body
        assert "error" in json.loads(answer.body), f"{label}: {answer.body[:300]!r}"


# -- the table -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class Case:
    id: str
    method: str
    target: str  # the request-target, byte for byte (latin-1)
    expect: frozenset[int]
    headers: tuple[tuple[str, str | None], ...] = ()
    body: bytes | None = None
    framing: bool = True  # add a Content-Length for the body
    is_shard: bool = False  # a 200 must carry exactly the shard

    def __repr__(self) -> str:  # the bodies are megabytes: keep failure reports readable
        return f"Case({self.id})"


REFUSED = frozenset({400, 404})  # a key that is refused, or that no origin holds
NOT_FOUND = frozenset({404})
BAD_REQUEST = frozenset({400})
OK = frozenset({200})
# 400: aiohttp's parser refuses a method it does not know; 404: the `/_/…` catch-all answers a
# method with no route there as an unknown endpoint.
NO_METHOD = frozenset({400, 404, 405, 501})
SHARD = "/files/real/shard.tar"
WEB_SHARD = "/web/s_000.tar"

# Each path escapes the origin's root (files) or prefix (web), in its own encoding.
TRAVERSALS = {
    "dotdot": "/{o}/../outside/secret.tar",
    "dotdot-deep": "/{o}/real/../../outside/secret.tar",
    "dotdot-to-etc": "/{o}/../../../../../../etc/passwd",
    "pct-dots": "/{o}/%2e%2e/outside/secret.tar",
    "pct-dots-slashes": "/{o}/%2e%2e%2foutside%2fsecret.tar",
    "pct-dots-upper": "/{o}/%2E%2E%2Foutside%2Fsecret.tar",
    "pct-dots-mixed": "/{o}/.%2e/%2E./outside/secret.tar",
    "double-encoded": "/{o}/%252e%252e/outside/secret.tar",
    "double-encoded-slashes": "/{o}/%252e%252e%252foutside%252fsecret.tar",
    "pct5c": "/{o}/..%5coutside%5csecret.tar",
    "pct5c-upper": "/{o}/..%5C..%5Cetc%5Cpasswd",
    "backslashes": "/{o}/..\\outside\\secret.tar",
    "absolute-slashes": "/{o}//etc/passwd",
    "absolute-pct2f": "/{o}/%2fetc%2fpasswd",
    "nul-suffix": "/{o}/real/shard.tar%00.txt",
    "nul-dotdot": "/{o}/..%00/outside/secret.tar",
    "overlong-utf8": "/{o}/%c0%ae%c0%ae/outside/secret.tar",
    "overlong-utf8-slash": "/{o}/%c0%ae%c0%ae%c0%afoutside%c0%afsecret.tar",
    "overlong-utf8-3byte": "/{o}/%e0%80%ae%e0%80%ae/outside/secret.tar",
    "dotdot-semicolon": "/{o}/..;/outside/secret.tar",
    "four-dots": "/{o}/....//outside/secret.tar",
    "dot-segment": "/{o}/./real/../../secret",
}

CASES: list[Case] = []
for _name, _path in TRAVERSALS.items():
    for _origin in ("web", "files"):
        CASES.append(Case(f"traversal-{_name}-{_origin}", "GET", _path.format(o=_origin), REFUSED))
CASES += [
    Case("traversal-head-pct-dots-files", "HEAD", "/files/%2e%2e/outside/secret.tar", REFUSED),
    Case("traversal-head-dotdot-web", "HEAD", "/web/../../etc/passwd", REFUSED),
    Case("traversal-root-etc-passwd", "GET", "//etc/passwd", NOT_FOUND),
    Case("traversal-files-double-slash-etc", "GET", "/files//etc/passwd", REFUSED),
    Case("traversal-absolute-form", "GET", "http://127.0.0.1/../../etc/passwd", REFUSED),
    Case("traversal-absolute-form-other-host", "GET", "http://evil.example/etc/passwd", REFUSED),
    Case("traversal-no-leading-slash", "GET", "files/../secret", REFUSED),
    Case("traversal-purge", "DELETE", "/_/cache/files/../outside/secret.tar", REFUSED),
    Case("traversal-purge-pct", "DELETE", "/_/cache/files/%2e%2e/secret", REFUSED),
]

# The file origin's links: out of the root they read as missing; within it they are served.
LINKS_OUT = {
    "abs-file": "/files/abs.tar",
    "abs-etc-passwd": "/files/passwd",
    "dir-link": "/files/dirlink/secret.tar",
    "relative-up": "/files/rel.tar",
    "relative-up-two": "/files/sub/rel.tar",
    "parent-dir-link": "/files/up/secret",
    "chain": "/files/chain1.tar",
    "chain-tail": "/files/sub/chain2.tar",
    "loop": "/files/loop1",
    "dangling": "/files/dangling.tar",
    "fifo": "/files/fifo.tar",
    "directory": "/files/real",
    "dir-link-itself": "/files/dirlink",
}
for _name, _path in LINKS_OUT.items():
    CASES.append(Case(f"link-{_name}", "GET", _path, NOT_FOUND))
    CASES.append(Case(f"link-{_name}-head", "HEAD", _path, NOT_FOUND))
CASES += [
    Case(
        "link-dir-link-ranged",
        "GET",
        "/files/dirlink/secret.tar",
        NOT_FOUND,
        (("Range", "bytes=0-9"),),
    ),
    Case("link-inside", "GET", "/files/inside.tar", OK, is_shard=True),
    Case("link-inside-dir", "GET", "/files/indir/shard.tar", OK, is_shard=True),
    Case("link-inside-head", "HEAD", "/files/inside.tar", OK),
]

# Keys over the limits, unknown origins.
CASES += [
    Case("key-300-char-segment-files", "GET", "/files/" + "n" * 300 + ".tar", REFUSED),
    Case("key-300-char-segment-web", "GET", "/web/" + "n" * 300 + ".tar", REFUSED),
    Case("key-5000-chars-files", "GET", "/files/" + "k" * 5000, BAD_REQUEST),
    Case("key-5000-chars-web", "GET", "/web/" + "k" * 5000, BAD_REQUEST),
    Case("key-2500-segments", "GET", "/files/" + "a/" * 2499 + "a", BAD_REQUEST),
    Case("key-empty", "GET", "/files/", BAD_REQUEST),
    Case("origin-no-key", "GET", "/files", NOT_FOUND),
    Case("origin-unknown", "GET", "/nope/s_000.tar", NOT_FOUND),
    Case("origin-unknown-dotdot", "GET", "/../files/real/shard.tar", REFUSED),
    Case("origin-reserved-metrics", "GET", "/metrics/x", NOT_FOUND),
    Case("origin-reserved-underscore", "GET", "/_/files/real/shard.tar", NOT_FOUND),
    # `%2f` decoded to a separator names the shard: a 200 there is no escape.
    Case(
        "origin-pct-slash", "GET", "/files%2freal/shard.tar", frozenset({200, 404}), is_shard=True
    ),
    Case("origin-unicode", "GET", "/%e2%80%ae%73%65%6c%69%66/real/shard.tar", NOT_FOUND),
    Case("origin-long", "GET", "/" + "o" * 5000 + "/x", NOT_FOUND),
]

# Every method, on a shard and on the prefetch endpoint.
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]
METHODS += ["PROPFIND", "FROBNICATE"]
for _method in METHODS:
    _on_shard = OK if _method in ("GET", "HEAD") else NO_METHOD
    _on_prefetch = {
        "GET": OK,
        "HEAD": OK,
        "POST": BAD_REQUEST,  # an empty body
        "DELETE": OK,  # empties the queue: an admin's right on a loopback daemon
    }.get(_method, NO_METHOD)
    _body = b"x" if _method in ("POST", "PUT", "PATCH") else None
    CASES.append(Case(f"method-{_method}-shard", _method, SHARD, _on_shard, body=_body))
    CASES.append(
        Case(f"method-{_method}-prefetch", _method, "/_/prefetch", _on_prefetch, body=_body)
    )
CASES += [
    Case("method-lowercase-get", "get", SHARD, NO_METHOD),
    Case("method-OPTIONS-asterisk", "OPTIONS", "*", NO_METHOD),
    Case("method-CONNECT-authority", "CONNECT", "127.0.0.1:22", NO_METHOD),
]

# Range headers: a malformed one is ignored (RFC 9110 §14.2: the whole object), one past the
# end is 416, and one too large for aiohttp's header limit is 400. A number of 5,000 digits
# (past Python's 4,300-digit int() limit) may be read or ignored, never a 500.
_HUGE_START = frozenset({200, 416})
_HUGE_END = frozenset({200, 206})
_RANGES = {
    "abc": ("bytes=abc", OK),
    "backwards": ("bytes=5-1", OK),
    "many-ranges": ("bytes=" + "0-0,1-1," * 999 + "0-0", OK),
    "5000-digit-start": ("bytes=" + "9" * 5000 + "-", _HUGE_START),
    "5000-digit-end": ("bytes=0-" + "9" * 5000, _HUGE_END),
    "5000-digit-suffix": ("bytes=-" + "9" * 5000, _HUGE_END),
    "items-unit": ("items=0-1", OK),
    "past-the-end": ("bytes=99999999-", frozenset({416})),
    "zero-suffix": ("bytes=-0", frozenset({416})),
    "negative": ("bytes=-1-5", OK),
    "100kb": ("bytes=" + "0" * 100_000 + "-1", frozenset({400, 413, 431})),
}
for _name, (_value, _expect) in _RANGES.items():
    CASES.append(Case(f"range-{_name}", "GET", SHARD, _expect, (("Range", _value),), is_shard=True))
CASES += [
    Case(
        "range-5000-digit-head",
        "HEAD",
        SHARD,
        _HUGE_START,
        (("Range", "bytes=" + "9" * 5000 + "-"),),
    ),
    Case(
        "range-5000-digit-web",
        "GET",
        WEB_SHARD,
        _HUGE_START,
        (("Range", "bytes=" + "9" * 5000 + "-"),),
    ),
    Case("range-web-one-byte", "GET", WEB_SHARD, frozenset({206}), (("Range", "bytes=0-0"),)),
]

# Headers and URLs of every size, and framing that does not add up.
_TOO_LARGE = frozenset({400, 413, 414, 431})
CASES += [
    Case("header-100kb", "GET", SHARD, _TOO_LARGE, (("X-Big", "a" * 100_000),)),
    Case("header-100kb-name", "GET", SHARD, _TOO_LARGE, (("X-" + "n" * 100_000, "v"),)),
    # 100 KB in headers under aiohttp's count limit (128), then over it.
    Case(
        "headers-100-of-1000b",
        "GET",
        SHARD,
        frozenset({200, 400, 431}),
        tuple((f"X-H{i}", "v" * 1000) for i in range(100)),
        is_shard=True,
    ),
    Case(
        "headers-200-of-500b",
        "GET",
        SHARD,
        frozenset({200, 400, 431}),
        tuple((f"X-H{i}", "v" * 500) for i in range(200)),
        is_shard=True,
    ),
    Case(
        "headers-5000-tiny",
        "GET",
        SHARD,
        frozenset({200, 400, 431}),
        tuple((f"X-{i}", "v") for i in range(5000)),
        is_shard=True,
    ),
    Case(
        "header-latin1-bytes",
        "GET",
        SHARD,
        frozenset({200, 400}),
        (("X-Bytes", "\xff\xfe\x80"),),
        is_shard=True,
    ),
    Case("header-no-colon", "GET", SHARD, BAD_REQUEST, (("X-No-Colon-Here", None),)),
    Case(
        "header-ctl-char",
        "GET",
        SHARD,
        frozenset({200, 400}),
        (("X-Ctl", "a\x01b\x7fc"),),
        is_shard=True,
    ),
    Case("url-8kb", "GET", "/files/" + "x" * 8000, BAD_REQUEST),
    Case("url-70kb", "GET", "/files/" + "x" * 70_000, _TOO_LARGE),
    Case(
        "framing-cl-and-te",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        (("Content-Length", "5"), ("Transfer-Encoding", "chunked")),
        b"0\r\n\r\n",
        framing=False,
    ),
    Case(
        "framing-two-content-lengths",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        (("Content-Length", "2"), ("Content-Length", "3")),
        b"{}",
        framing=False,
    ),
    Case(
        "framing-bad-chunk",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        (("Transfer-Encoding", "chunked"),),
        b"zz\r\nxx\r\n0\r\n\r\n",
        framing=False,
    ),
    Case(
        "framing-huge-chunk-size",
        "POST",
        "/_/prefetch",
        frozenset({400, 413}),
        (("Transfer-Encoding", "chunked"),),
        b"ffffffffffffffffffff\r\nxx\r\n0\r\n\r\n",
        framing=False,
    ),
    Case(
        "framing-negative-length",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        (("Content-Length", "-1"),),
        b"",
        framing=False,
    ),
    Case(
        "framing-huge-length-announced",
        "POST",
        "/_/prefetch",
        frozenset({413}),
        (("Content-Length", "99999999999"),),
        b"{}",
        framing=False,
    ),
]


def _prefetch(body: object) -> bytes:
    return json.dumps(body).encode()


# Prefetch bodies: huge, deep, bombs, and keys that traverse or name the links out.
_TOO_MANY_KEYS = _prefetch({"origin": "web", "keys": [f"k{i:06d}.tar" for i in range(200_000)]})
CASES += [
    Case("prefetch-deep-json", "POST", "/_/prefetch", BAD_REQUEST, body=b"[" * 100_000),
    Case(
        "prefetch-deep-json-closed",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=b"[" * 100_000 + b"]" * 100_000,
    ),
    Case(
        "prefetch-deep-objects",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    ),
    Case(
        "prefetch-5mib-whitespace",
        "POST",
        "/_/prefetch",
        frozenset({413}),
        body=b"{" + b" " * (5 << 20) + b"}",
    ),
    Case("prefetch-200k-keys", "POST", "/_/prefetch", BAD_REQUEST, body=_TOO_MANY_KEYS),
    Case(
        "prefetch-brace-range-bomb",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": ["shards_{000000000..999999999}.tar"]}),
    ),
    Case(
        "prefetch-brace-product-bomb",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": ["{a,b}" * 21]}),
    ),
    Case(
        "prefetch-brace-nesting",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": ["{" * 40 + "a" + "}" * 40]}),
    ),
    Case("prefetch-not-json", "POST", "/_/prefetch", BAD_REQUEST, body=b"not json"),
    Case(
        "prefetch-not-utf8",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=b'{"origin":"web","keys":["\xff\xfe"]}',
    ),
    Case("prefetch-not-an-object", "POST", "/_/prefetch", BAD_REQUEST, body=b"[1, 2, 3]"),
    Case(
        "prefetch-origin-not-a-string",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": 5, "keys": ["a"]}),
    ),
    Case(
        "prefetch-keys-not-strings",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": [1, None]}),
    ),
    Case(
        "prefetch-unknown-origin",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "nope", "keys": ["a"]}),
    ),
    Case(
        "prefetch-unknown-field",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": ["a"], "x": 1}),
    ),
    Case(
        "prefetch-nan", "POST", "/_/prefetch", BAD_REQUEST, body=b'{"origin": NaN, "keys": ["a"]}'
    ),
    Case(
        "prefetch-huge-number",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=b'{"origin": 1' + b"0" * 5000 + b', "keys": ["a"]}',
    ),
    Case(
        "prefetch-traversal-files",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "files", "keys": ["../outside/secret.tar"]}),
    ),
    Case(
        "prefetch-traversal-web",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": ["../../etc/passwd"]}),
    ),
    Case(
        "prefetch-traversal-urls",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"urls": ["/files/../secret"]}),
    ),
    # In a brace pattern a backslash escapes the next character (braceexpand, as WebDataset
    # expands it): `..\\..\\etc` denotes the harmless key `....etc`; `\\\\` is a backslash.
    Case(
        "prefetch-backslash-as-escape",
        "POST",
        "/_/prefetch",
        frozenset({202}),
        body=_prefetch({"origin": "web", "keys": ["..\\..\\etc\\passwd"]}),
    ),
    Case(
        "prefetch-traversal-backslash",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "web", "keys": ["..\\\\..\\\\etc\\\\passwd"]}),
    ),
    Case(
        "prefetch-traversal-brace",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "files", "keys": ["{..,real}/shard.tar"]}),
    ),
    Case(
        "prefetch-traversal-absolute",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "files", "keys": ["/etc/passwd"]}),
    ),
    Case(
        "prefetch-traversal-nul",
        "POST",
        "/_/prefetch",
        BAD_REQUEST,
        body=_prefetch({"origin": "files", "keys": ["real/shard.tar\x00"]}),
    ),
    # Literal `%2e%2e` is a valid key (a file of that name): queued, and found nowhere.
    Case(
        "prefetch-pct-dots-files",
        "POST",
        "/_/prefetch",
        frozenset({202}),
        body=_prefetch({"origin": "files", "keys": ["%2e%2e/outside/secret.tar"]}),
    ),
    Case(
        "prefetch-pct-dots-web",
        "POST",
        "/_/prefetch",
        frozenset({202}),
        body=_prefetch({"origin": "web", "keys": ["%2e%2e/%2e%2e/etc/passwd"]}),
    ),
    Case(
        "prefetch-lone-surrogate-files",
        "POST",
        "/_/prefetch",
        frozenset({202, 400}),
        body=b'{"origin": "files", "keys": ["\\ud800.tar"]}',
    ),
    Case(
        "prefetch-lone-surrogate-web",
        "POST",
        "/_/prefetch",
        frozenset({202, 400}),
        body=b'{"origin": "web", "keys": ["\\ud800.tar"]}',
    ),
    # The links out of the root are valid keys: queued, then failed as missing; the module's
    # last checks look for their bytes in the cache.
    Case(
        "prefetch-links-out",
        "POST",
        "/_/prefetch",
        frozenset({202}),
        body=_prefetch(
            {"origin": "files", "keys": [p.removeprefix("/files/") for p in LINKS_OUT.values()]}
        ),
    ),
    Case(
        "prefetch-links-out-urls",
        "POST",
        "/_/prefetch",
        frozenset({202}),
        body=_prefetch({"urls": list(LINKS_OUT.values())}),
    ),
]

# Query strings.
CASES += [
    Case("query-batch-superscript-two", "GET", "/_/prefetch?batch=%C2%B2", NOT_FOUND),
    # int() reads Arabic-Indic digits: batch 3 (queued by the rows above) is found.
    Case("query-batch-arabic-indic", "GET", "/_/prefetch?batch=%D9%A3", frozenset({200, 404})),
    Case("query-batch-huge", "GET", "/_/prefetch?batch=99999999999999999999999", NOT_FOUND),
    Case("query-batch-5000-digits", "GET", "/_/prefetch?batch=" + "9" * 5000, NOT_FOUND),
    Case("query-batch-negative", "GET", "/_/prefetch?batch=-1", NOT_FOUND),
    Case("query-batch-nul", "GET", "/_/prefetch?batch=%00", NOT_FOUND),
    Case("query-batch-empty", "GET", "/_/prefetch?batch=", NOT_FOUND),
    Case("query-batch-bad-escape", "GET", "/_/prefetch?batch=%zz", NOT_FOUND),
    Case("query-on-shard", "GET", SHARD + "?x=%zz&y=%00&" + "a=b&" * 1000, OK, is_shard=True),
    Case("query-traversal-on-shard", "GET", SHARD + "?../../etc/passwd", OK, is_shard=True),
    Case("query-on-status", "GET", "/_/status?%ff%fe=%c0%ae", OK),
]

# An origin that redirects to another host. 502 is the daemon's documented answer for an
# origin's failure (not the client's): the one row where a 5xx is expected.
CASES += [
    Case("redirect-to-another-host", "GET", "/web/redir.tar", frozenset({502})),
    Case("redirect-to-another-host-head", "HEAD", "/web/redir.tar", frozenset({502})),
]

# Rows a legitimate client sends, to show the daemon serves through all of the above.
CASES += [
    Case("legit-file-shard", "GET", SHARD, OK, is_shard=True),
    Case("legit-web-shard", "GET", WEB_SHARD, OK, is_shard=True),
]


ROWS_LOGGED: list[tuple[str, int, int]] = []  # (case id, start, end) of its part of the log


MEASURED: list[tuple[str, float, int]] = []  # (row, best answer time s, RSS growth bytes)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_request(target: Target, case: Case) -> None:
    daemon = target.daemon
    pid = daemon.process.pid

    def send() -> Answer:
        return raw_request(
            daemon.port, case.method, case.target, case.headers, case.body, framing=case.framing
        )

    log_start = daemon.log_path.stat().st_size
    rss_before = rss_bytes(pid)
    answers = [send()]
    # The 100 ms bound is for the daemon's own work. This 2-core machine is noisy (the origins
    # run in the test process, the CI shares the cores), so a slow answer is sent again, at
    # most twice, and the best time counts. Every try is checked for everything else.
    while answers[-1].elapsed_s >= ANSWER_WITHIN_S and len(answers) < 3:
        answers.append(send())
    rss_growth = rss_bytes(pid) - rss_before
    # A traceback is logged before the answer that follows it leaves, so it lies in this span.
    ROWS_LOGGED.append((case.id, log_start, daemon.log_path.stat().st_size))

    for answer in answers:
        assert_sound(answer, case.expect, case.id)
        if case.is_shard and answer.status == 200 and case.method == "GET":
            assert answer.body == target.shard, f"{case.id}: not the shard"
    MEASURED.append((case.id, min(a.elapsed_s for a in answers), rss_growth))
    times = ", ".join(f"{answer.elapsed_s * 1000:.1f}" for answer in answers)
    assert min(a.elapsed_s for a in answers) < ANSWER_WITHIN_S, f"{case.id}: {times} ms"
    assert rss_growth < RSS_GROWTH_LIMIT, f"{case.id}: RSS grew {rss_growth >> 20} MiB"
    assert raw_request(daemon.port, "GET", "/healthz").status == 200


# -- over the whole run --------------------------------------------------------------------


_ACCESS = re.compile(r"aiohttp\.access: (\S+) (.*) (\d{3}) \S+ -?\d+ [\d.]+ms$")
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")


def access_lines(log: str) -> list[tuple[str, str, int]]:
    """(method, path, status) of every access line in a text-format log."""
    found = []
    for line in log.splitlines():
        if (match := _ACCESS.search(line)) is not None:
            found.append((match.group(1), match.group(2), int(match.group(3))))
    return found


def tracebacks(log: bytes, rows: Sequence[tuple[str, int, int]] = ()) -> list[str]:
    """One line per traceback in a text-format log: the row whose request wrote it (`rows` is
    (case id, start, end) byte offsets into the log), the record that carried it, and the
    exception it ends with (`[row] … aiohttp.server: Error handling … | LineTooLong: …`)."""
    lines = log.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    texts = [line.decode(errors="replace").rstrip("\n") for line in lines]
    found = []
    for number, line in enumerate(texts):
        if not line.startswith("Traceback"):
            continue
        record = next((texts[i] for i in range(number - 1, -1, -1) if _RECORD.match(texts[i])), "")
        tail = number + 1
        while tail < len(texts) and (texts[tail].startswith(" ") or not texts[tail]):
            tail += 1
        exception = texts[tail] if tail < len(texts) else "?"
        row = next((f"[{id}] " for id, start, end in rows if start <= offsets[number] < end), "")
        found.append(f"{row}{_RECORD.sub('', record)[:80]} | {exception[:140]}")
    return found


def test_the_log_has_no_unhandled_error(target: Target) -> None:
    log = target.daemon.log_path.read_bytes()
    unhandled = [line for line in tracebacks(log, ROWS_LOGGED) if "unhandled error" in line]
    assert unhandled == [] and b"unhandled error" not in log, "\n".join(unhandled)


def test_the_log_has_no_traceback(target: Target) -> None:
    found = tracebacks(target.daemon.log_path.read_bytes(), ROWS_LOGGED)
    assert found == [], f"{len(found)} tracebacks:\n" + "\n".join(found)


def test_no_access_line_is_a_server_error(target: Target) -> None:
    lines = access_lines(target.daemon.log())
    assert len(lines) > len(CASES)  # the format is still the one parsed here
    # The documented 502 for the redirecting origin is the one 5xx the table expects.
    errors = [line for line in lines if line[2] >= 500 and line[1] != "/web/redir.tar"]
    assert errors == [], "\n".join(
        f"{method} {path[:100]} {status}" for method, path, status in errors
    )


def outside_the_prefix(raw_paths: Sequence[str]) -> list[str]:
    """The raw paths an origin was asked for that lie outside WEB_PREFIX, as its own router
    sees them (one percent-decoding, then dot segments removed) or as sent."""
    outside = []
    for raw_path in raw_paths:
        path = posixpath.normpath(unquote_to_bytes(raw_path.partition("?")[0]).decode("latin-1"))
        if not raw_path.startswith(WEB_PREFIX + "/") or not path.startswith(WEB_PREFIX + "/"):
            outside.append(raw_path)
    return outside


def test_the_http_origin_was_asked_only_within_its_prefix(target: Target) -> None:
    assert target.web.seen, "the origin was never asked: the table did not reach it"
    assert outside_the_prefix(target.web.seen) == []
    assert sum(target.web.gets[key] for key in ("outside/secret.tar", "secret", "etc/passwd")) == 0


def test_the_other_host_was_never_asked(target: Target) -> None:
    assert (
        target.web.heads[WEB_PREFIX[1:] + "/redir.tar"]
        + target.web.gets[WEB_PREFIX[1:] + "/redir.tar"]
        > 0
    ), "the redirect rows never reached the origin"
    assert target.elsewhere.seen == []


def test_nothing_from_outside_was_cached(target: Target) -> None:
    daemon = target.daemon

    def settled() -> bool:  # the prefetch rows queued links out of the root
        status = daemon.get_json("/_/prefetch")[1]
        return status["pending"] == 0 and status["in_flight"] == 0

    wait_for("the prefetch queue settles", settled)
    holding = [
        path
        for path in daemon.cache_dir.rglob("*")
        if path.is_file()
        and not path.is_symlink()
        and (SECRET_MARKER in (data := path.read_bytes()) or PASSWD_MARKER in data)
    ]
    assert holding == []
    assert raw_request(daemon.port, "GET", "/healthz").status == 200


def test_the_worst_case_over_the_table() -> None:
    """Every row ran and was measured; print the worst time and memory for the record."""
    assert len(MEASURED) == len(CASES), f"{len(MEASURED)} of {len(CASES)} rows measured"
    slowest = max(MEASURED, key=lambda row: row[1])
    hungriest = max(MEASURED, key=lambda row: row[2])
    print(
        f"\n{len(MEASURED)} hostile rows: slowest {slowest[0]} {slowest[1] * 1000:.1f} ms, "
        f"most memory {hungriest[0]} {hungriest[2] / 2**20:.1f} MiB"
    )
    assert slowest[1] < ANSWER_WITHIN_S and hungriest[2] < RSS_GROWTH_LIMIT
