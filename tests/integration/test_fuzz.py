"""Property-based fuzz of the daemon's HTTP surface (issue 10): random paths, headers, query
strings and prefetch bodies, each sent as raw bytes to one running daemon (the origins and
links of `test_hostile_table`). No answer may be a 5xx, fail to arrive, or carry a byte from
outside an origin; at the end the log holds no traceback and the daemon still answers.

Hypothesis keeps no example database here (`database=None`): the repository has no place
for one, and a failure prints the example to rerun it with `@example`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_hostile_table import (
    PASSWD_MARKER,
    SECRET_MARKER,
    Answer,
    Target,
    outside_the_prefix,
    raw_request,
    running_target,
    tracebacks,
)

EXAMPLES = 400  # per strategy: about 5 ms each against a warm daemon
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
SHARD = "/files/real/shard.tar"
WEB_SHARD = "/web/s_000.tar"
# Headers that frame the message: random values would leave the daemon waiting for a body
# that never comes (a timeout, not a finding) or switch protocols. The table covers them.
# Python's int() refuses more than 4300 digits: runs of digits cross that line.
_DIGIT_RUNS = st.one_of(st.integers(0, 6000), st.sampled_from([4300, 4301, 5000]))
FRAMING = {"content-length", "transfer-encoding", "connection", "upgrade", "expect"}


pytestmark = [
    # A failing example with a dozen 9 KB headers has a large repr: Hypothesis warns about
    # the cost of printing it, and this project turns warnings into errors.
    pytest.mark.filterwarnings(
        "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
    ),
    # On a failure Hypothesis imports libcst to suggest a patch, which warns on import; as an
    # error that crashes the whole session (INTERNALERROR) instead of reporting the example.
    pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with running_target(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


def send(
    target: Target,
    method: str,
    request_target: bytes | str,
    headers: tuple[tuple[bytes | str, bytes | str | None], ...] = (),
    body: bytes | None = None,
) -> Answer:
    """Send one request; assert it got a whole answer that is no 5xx and leaks nothing."""
    answer = raw_request(target.daemon.port, method, request_target, headers, body)
    shown = request_target[:200]
    assert answer.status < 500, f"{method} {shown!r}: {answer.status} {answer.body[:300]!r}"
    assert SECRET_MARKER not in answer.body and PASSWD_MARKER not in answer.body, shown
    return answer


# -- strategies ------------------------------------------------------------------------------

_NOT_CRLF = st.characters(codec="utf-8", exclude_characters="\r\n")
_HOSTILE_PIECES = [
    "..",
    ".",
    "/",
    "//",
    "%2e",
    "%2E%2e",
    "%2f",
    "%2F",
    "%5c",
    "\\",
    "%00",
    "%c0%ae",
    "%c0%af",
    "%e0%80%ae",
    "%252e",
    "%25",
    "%",
    "%z",
    "%e2%80%ae",
    "?",
    "#",
    ";",
    "*",
    "~",
    "{",
    "}",
    ",",
    "{0..3}",
    "{a,b}",
    "%ff",
    "%ed%a0%80",
    " ",
    "\t",
    "\x00",
    "\x7f",
    "é",
    "\u202e",
    "\ufeff",
]


def _escaped(data: bytes) -> str:
    return "".join(f"%{byte:02x}" for byte in data)


# Pieces of a path: dot segments and escapes in every spelling, text raw (control characters
# and UTF-8 too) or quoted, percent escapes of random bytes, and long runs.
path_piece = st.one_of(
    st.sampled_from(_HOSTILE_PIECES),
    st.text(_NOT_CRLF, max_size=16),
    st.text(_NOT_CRLF, max_size=16).map(lambda text: quote(text, safe="/")),
    st.binary(max_size=8).map(_escaped),
    st.integers(0, 3000).map(lambda n: "a" * n),
)
path_prefix = st.sampled_from(
    [
        "/web/",
        "/files/",
        "/files/real/",
        "/files/indir/",
        "/files/dirlink/",
        "/files/up/",
        "/_/",
        "/_/prefetch",
        "/_/cache/files/",
        "/_/cache/web/",
        "/nope/",
        "/",
        "//",
        "",
    ]
)


@st.composite
def paths(draw: st.DrawFn) -> bytes:
    pieces = draw(st.lists(path_piece, max_size=10))
    return (draw(path_prefix) + "".join(pieces)).encode("utf-8", "surrogatepass")


def _is_framing(name: str | bytes) -> bool:
    text = name if isinstance(name, str) else name.decode("latin-1")
    return text.strip().lower() in FRAMING


_TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
header_name = st.one_of(
    st.sampled_from(
        [
            "Range",
            "If-Match",
            "If-None-Match",
            "If-Range",
            "If-Modified-Since",
            "Accept-Encoding",
            "Authorization",
            "Cookie",
            "Content-Type",
            "X-Forwarded-For",
            "Forwarded",
            "Origin",
            "Host",
            "TE",
            "Trailer",
            "Max-Forwards",
            "Keep-Alive",
        ]
    ),
    st.text(st.sampled_from(_TOKEN), min_size=1, max_size=40),
    st.binary(min_size=1, max_size=30).filter(lambda b: b"\r" not in b and b"\n" not in b),
).filter(lambda name: not _is_framing(name))
header_value = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
    st.text(_NOT_CRLF, max_size=30),  # sent as UTF-8
    st.integers(0, 9000).map(lambda n: "v" * n),
).map(lambda value: value.encode("utf-8")) | st.binary(max_size=60).filter(
    lambda b: b"\r" not in b and b"\n" not in b
)
# Range gets its own values (the shard rows honour it): well formed, multi, odd digits, huge.
range_value = (
    st.one_of(
        st.from_regex(r"bytes=-?\d{0,30}-?\d{0,30}(,\d{0,5}-\d{0,5}){0,5}", fullmatch=True),
        _DIGIT_RUNS.map(lambda n: "bytes=" + "9" * n + "-"),
        _DIGIT_RUNS.map(lambda n: "bytes=0-" + "9" * n),
        _DIGIT_RUNS.map(lambda n: "bytes=-" + "9" * n),
    ).map(lambda value: value.encode("utf-8"))
    | header_value
)
header = st.tuples(st.just("Range"), range_value) | st.tuples(header_name, header_value)

# A query string: `batch=` with every kind of digit (Unicode Nd and No, huge numbers) and random
# pairs, raw or escaped.
query_value = st.one_of(
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=6),
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=6).map(
        lambda digits: quote(digits, safe="")
    ),
    st.integers(-(10**30), 10**30).map(str),
    _DIGIT_RUNS.map(lambda n: "9" * n),
    st.text(_NOT_CRLF, max_size=20).map(lambda text: quote(text, safe="")),
    st.text(_NOT_CRLF.filter(lambda c: c not in " #"), max_size=20),
    st.binary(max_size=8).map(_escaped),
)
query_pair = st.one_of(
    query_value.map(lambda value: "batch=" + value),
    st.tuples(query_value, query_value).map("=".join),
    query_value,
)


@st.composite
def query_strings(draw: st.DrawFn) -> bytes:
    pairs = draw(st.lists(query_pair, min_size=1, max_size=5))
    return "&".join(pairs).encode("utf-8", "surrogatepass")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and Infinity too: Python's json reads them
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)

# Keys shaped like shard names, with braces, dot segments, separators, escapes, surrogates.
key_piece = st.one_of(
    st.sampled_from(_HOSTILE_PIECES),
    st.sampled_from(["{0..9}", "{000..002}", "{a..c}", "{1..10000000}", "{,}", "{{a,b}}", "\\{"]),
    st.sampled_from(["real/shard.tar", "abs.tar", "dirlink/secret.tar", "chain1.tar", "s_000"]),
    st.text(max_size=12),
    st.characters(categories=["Cs"]),  # a lone surrogate, as `\ud800` in the JSON
)
keys = st.lists(key_piece, max_size=6).map("".join)
origin_names = st.one_of(
    st.sampled_from(["web", "files"]),
    st.sampled_from(["nope", "", "_", "metrics", "WEB", "files/", "web\x00"]),
    st.text(),
)
local_urls = st.tuples(st.sampled_from(["/web/", "/files/"]), keys).map("".join)
urls = st.one_of(
    local_urls,
    st.tuples(st.sampled_from(["/nope/", "web/", "/", "", "//web/", "/_/"]), keys).map("".join),
    st.text(),
)
# Bodies a loader could send, with hostile keys: these reach expansion, the store and origins.
well_formed_bodies = st.fixed_dictionaries(
    {"origin": st.sampled_from(["web", "files"]), "keys": st.lists(keys, min_size=1, max_size=5)}
) | st.fixed_dictionaries({"urls": st.lists(local_urls, min_size=1, max_size=5)})
# Bodies with every field optional and any JSON in it: these exercise the refusals.
wild_bodies = st.fixed_dictionaries(
    {},
    optional={
        "origin": st.one_of(origin_names, json_values),
        "keys": st.one_of(st.lists(keys, max_size=5), json_values),
        "urls": st.one_of(st.lists(urls, max_size=5), json_values),
        "extra": json_values,
    },
)


# -- properties ------------------------------------------------------------------------------


@FUZZ
@given(method=st.sampled_from(["GET", "HEAD", "DELETE"]), path=paths())
def test_random_paths(target: Target, method: str, path: bytes) -> None:
    send(target, method, path)


@FUZZ
@given(
    method=st.sampled_from(["GET", "HEAD"]),
    path=st.sampled_from([SHARD, WEB_SHARD, "/files/inside.tar", "/healthz", "/_/prefetch"]),
    headers=st.lists(header, max_size=12),
)
def test_random_headers(
    target: Target, method: str, path: str, headers: list[tuple[bytes | str, bytes | str]]
) -> None:
    send(target, method, path, tuple(headers))


@FUZZ
@given(
    path=st.sampled_from(
        [
            "/_/prefetch",
            "/_/status",
            "/_/origins",
            SHARD,
            "/healthz",
            "/_/cache",
            "/_/cache?origin=files&pattern=*",  # the fuzzed query goes on in the glob
            "/_/cache?origin=web&after=x",  # … or in the cursor
        ]
    ),
    query=query_strings(),
)
def test_random_query_strings(target: Target, path: str, query: bytes) -> None:
    send(target, "GET", path.encode() + b"?" + query)


def _post_prefetch(target: Target, body: bytes) -> None:
    answer = send(target, "POST", "/_/prefetch", body=body)
    if answer.status >= 400 and answer.body:
        assert "error" in json.loads(answer.body), answer.body[:300]
    if answer.status == 202:  # drop what was queued: the next example starts from empty
        send(target, "DELETE", "/_/prefetch")


@FUZZ
@given(body=json_values)
def test_random_json_prefetch_bodies(target: Target, body: object) -> None:
    _post_prefetch(target, json.dumps(body).encode())


@FUZZ
@given(body=well_formed_bodies | wild_bodies)
def test_random_prefetch_bodies_shaped_like_the_real_one(
    target: Target, body: dict[str, object]
) -> None:
    _post_prefetch(target, json.dumps(body).encode())


# -- over the whole run ----------------------------------------------------------------------


def test_the_daemon_still_serves(target: Target) -> None:
    assert send(target, "GET", "/healthz").status == 200
    shard = send(target, "GET", SHARD)
    assert (shard.status, shard.body) == (200, target.shard)


def test_the_log_has_no_traceback_or_unhandled_error(target: Target) -> None:
    log = target.daemon.log_path.read_bytes()
    found = tracebacks(log)
    assert found == [] and b"unhandled error" not in log, f"{len(found)} tracebacks:\n" + (
        "\n".join(sorted(set(found)))
    )


def test_the_http_origin_was_asked_only_within_its_prefix(target: Target) -> None:
    assert outside_the_prefix(target.web.seen) == []
    assert target.elsewhere.seen == []
