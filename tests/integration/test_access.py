"""The admin token (issue 10, access control): a daemon reachable from other machines refuses
to start without one, and with one every endpoint that changes state or reveals configuration
answers 401 to a request that lacks it, while probes, metrics and (by default) reads stay open.
On the code before, every one of these requests was answered 200 to anybody."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import run_cli
from tests.origin_server import OriginServer

TOKEN = secrets.token_hex(24)
# One wrong token of the same length, one that shares all but the last character.
WRONG_TOKENS = [secrets.token_hex(24), TOKEN[:-1] + ("0" if TOKEN[-1] != "0" else "1")]

PROTECTED = [
    ("GET", "/_/", None),  # the status page
    ("GET", "/_/status", None),
    ("GET", "/_/origins", None),
    ("GET", "/_/prefetch", None),
    ("POST", "/_/prefetch", b'{"origin": "web", "keys": ["s_000.tar"]}'),
    ("DELETE", "/_/prefetch", None),
    ("DELETE", "/_/cache/web/s_000.tar", None),
    ("GET", "/_/nothing-here", None),
]
OPEN = [("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")]
READS = [("GET", "/web/s_000.tar"), ("HEAD", "/web/s_000.tar")]


def _send(
    daemon: Daemon, method: str, path: str, body: bytes | None = None, token: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(daemon.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def guarded(origin: OriginServer, start_daemon) -> Daemon:
    """A daemon on 0.0.0.0, as the DaemonSet runs it, with the token from the environment."""
    origin.put("s_000.tar", b"x" * 4096)
    return start_daemon(
        {"web": origin.url},
        "--readahead",
        "0",
        listen_host="0.0.0.0",
        env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
        token=TOKEN,
    )


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED, ids=[p for _, p, _ in PROTECTED])
def test_protected_endpoints_need_the_token(
    guarded: Daemon, method: str, path: str, body: bytes | None
) -> None:
    for token in [None, *WRONG_TOKENS, ""]:
        status, headers, answer = _send(guarded, method, path, body, token)
        assert status == 401, (token, status, answer)
        assert "error" in json.loads(answer)
        scheme = "Basic" if path == "/_/" else "Bearer"  # a browser asks for Basic only
        assert headers.get("WWW-Authenticate", "").startswith(scheme)
    # "Basic TOKEN" is not the scheme, even with the right secret.
    request = urllib.request.Request(
        guarded.url + path, data=body, method=method, headers={"Authorization": f"Basic {TOKEN}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code == 401
    status, _, answer = _send(guarded, method, path, body, TOKEN)
    if path == "/_/":
        assert status == 200 and b"<title>shardcache status</title>" in answer
        return
    expected = 404 if path in ("/_/nothing-here", "/_/cache/web/s_000.tar") else None
    assert status == expected if expected else status in (200, 202), (status, answer)
    # What a wrong token asked for was not done: the refused POSTs queued nothing.
    assert guarded.metric("shardcache_client_refused_total", reason="unauthorized") >= 4


def test_probes_metrics_and_reads_stay_open_and_the_token_is_never_logged(
    guarded: Daemon,
) -> None:
    for method, path in [*OPEN, *READS]:
        assert _send(guarded, method, path)[0] == 200, path
    _send(guarded, "GET", "/_/status", token=WRONG_TOKENS[0])
    _send(guarded, "GET", "/_/status", token=TOKEN)
    guarded.wait_for_log("GET /_/status 200")
    log = guarded.log()
    assert "admin token required for /_/" in log  # the start line says what is guarded
    assert TOKEN not in log and WRONG_TOKENS[0] not in log
    assert TOKEN[:16] not in log  # not even a prefix


def test_require_token_for_reads(origin: OriginServer, start_daemon, tmp_path: Path) -> None:
    origin.put("s_000.tar", b"x" * 4096)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # a Secret's file often ends in a newline
    daemon = start_daemon(
        {"web": origin.url},
        "--require-token-for-reads",
        "--admin-token-file",
        str(token_file),
        token=TOKEN,
    )
    for method, path in READS:
        assert _send(daemon, method, path)[0] == 401, path
        assert _send(daemon, method, path, token=WRONG_TOKENS[1])[0] == 401, path
        status, _, body = _send(daemon, method, path, token=TOKEN)
        assert status == 200 and (method == "HEAD" or body == b"x" * 4096)
    assert origin.gets["s_000.tar"] == 1  # the refused reads fetched nothing
    for method, path in OPEN:
        assert _send(daemon, method, path)[0] == 200, path

    # The recipe of docs/integrity-and-security.md (Security): a header file, and
    # `url --pipe --curl-header` to use it.
    header_file = tmp_path / "header"
    header_file.write_text(f"Authorization: Bearer {TOKEN}\n")
    env = {"SHARDCACHE_URL": daemon.url, "SHARDCACHE_ADMIN_TOKEN_FILE": str(token_file)}
    mapped = run_cli("url", "--pipe", "--curl-header", str(header_file), "/web/s_000.tar", env=env)
    command = mapped.stdout.strip()
    assert command == f"pipe:curl -s -f -H @{header_file} {daemon.url}/web/s_000.tar", mapped
    fetched = subprocess.run(command.removeprefix("pipe:"), shell=True, capture_output=True)
    assert fetched.returncode == 0 and fetched.stdout == b"x" * 4096
    without = subprocess.run(f"curl -s -f {daemon.url}/web/s_000.tar", shell=True)
    assert without.returncode == 22  # curl -f on the 401


def test_the_client_cli_and_webdataset_stage_send_the_token(
    guarded: Daemon, tmp_path: Path
) -> None:
    env = {"SHARDCACHE_URL": guarded.url}
    refused = run_cli("stats", env=env)
    assert refused.returncode != 0 and "SHARDCACHE_ADMIN_TOKEN" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert run_cli("stats", "--json", env={**env, "SHARDCACHE_ADMIN_TOKEN": TOKEN}).returncode == 0
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    by_file = {**env, "SHARDCACHE_ADMIN_TOKEN_FILE": str(token_file)}
    assert run_cli("url", "/web/s_000.tar", env=by_file).stdout.strip().endswith("/web/s_000.tar")

    # The WebDataset stage, in a process of its own as in a dataloader worker.
    stage = (
        "from shardcache.loader.webdataset import prefetch_ahead\n"
        f"shards = [{{'url': 'pipe:curl -s -f {guarded.url}/web/s_00' + str(i) + '.tar'}}"
        " for i in range(3)]\n"
        "print(len(list(prefetch_ahead(2)(shards))))\n"
    )
    before = guarded.metric("shardcache_client_refused_total", reason="unauthorized")
    ran = subprocess.run(
        [sys.executable, "-c", stage],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **by_file},
    )
    assert ran.returncode == 0 and ran.stdout.strip() == "3", ran.stderr
    assert "reading on without prefetch" not in ran.stderr, ran.stderr
    assert guarded.metric("shardcache_client_refused_total", reason="unauthorized") == before
    status, document = guarded.get_json("/_/prefetch")
    assert status == 200 and document, document


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--listen", "0.0.0.0:1"], {}, "an admin token is required"),
        (["--listen", "[::]:1"], {}, "an admin token is required"),
        (["--listen", "10.1.2.3:1"], {}, "an admin token is required"),
        (["--require-token-for-reads"], {}, "--require-token-for-reads: needs"),
        (["--admin-token", "short"], {}, "at least 16 printable ASCII"),
        ([], {"SHARDCACHE_ADMIN_TOKEN": "has a space in it ok"}, "at least 16 printable ASCII"),
        (["--admin-token-file", "/does/not/exist"], {}, "cannot read /does/not/exist"),
        (
            [],
            {"SHARDCACHE_ADMIN_TOKEN_FILE": "/does/not/exist"},
            "SHARDCACHE_ADMIN_TOKEN_FILE: cannot read",
        ),
        (["--admin-token", TOKEN, "--admin-token-file", "/x"], {}, "give one, not both"),
    ],
    ids=[
        "any-v4",
        "any-v6",
        "an-address",
        "reads-no-token",
        "short",
        "space",
        "no-file",
        "no-file-env",
        "both",
    ],
)
def test_unsafe_access_settings_exit_2_with_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    result = run_cli("serve", "--cache-dir", str(tmp_path / "c"), *args, env=env)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "short" not in result.stderr.replace("--admin-token", "")  # no secret echoed
    assert TOKEN not in result.stderr


def test_insecure_no_token_is_an_explicit_choice(origin: OriginServer, start_daemon) -> None:
    daemon = start_daemon({"web": origin.url}, "--insecure-no-token", listen_host="0.0.0.0")
    assert daemon.get_json("/_/status")[0] == 200
    assert "no admin token: INSECURE" in daemon.log()
    assert "WARNING shardcache.daemon: listening on 0.0.0.0" in daemon.log()


CROSS_SITE = [  # what a browser adds to a request a page of another site makes it send
    {"Origin": "https://evil.example"},
    {"Origin": "null"},  # a sandboxed frame or a file
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"},  # another port
]


@pytest.mark.parametrize("marks", CROSS_SITE, ids=lambda marks: ",".join(marks.values()))
def test_a_change_a_web_page_sends_is_refused_even_without_a_token(
    marks: dict[str, str], origin: OriginServer, start_daemon
) -> None:
    """A loopback daemon without a token took `POST /_/prefetch` (and plans, verify) from any
    page open on the node: a text/plain form post needs no preflight (the attack review).
    Refused with 403 and counted; reads, and what the commands and curl send, still work."""
    origin.put("s_000.tar", b"x" * 4096)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    posts = [
        ("POST", "/_/prefetch", b'{"urls": ["/web/s_000.tar"], "warm": true}'),
        ("POST", "/_/plan", b'{"job": "j", "epoch": 0, "urls": ["/web/s_000.tar"]}'),
        ("POST", "/_/verify", b""),
        ("DELETE", "/_/cache?origin=web&pattern=*", None),
        ("DELETE", "/_/prefetch", None),
    ]
    for method, path, body in posts:
        headers = {"Content-Type": "text/plain", **marks}
        request = urllib.request.Request(daemon.url + path, body, headers, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403, (method, path)
        assert json.loads(refused.value.read())["error"].startswith("a change to the daemon")
    assert sum(origin.gets.values()) == 0  # nothing was fetched for the page
    assert daemon.metric("shardcache_client_refused_total", reason="cross_site") == len(posts)
    # Reads stay open to pages (their answers are the browser's to withhold); the daemon's own
    # page's origin, and no marks at all (the commands, the client, curl) are accepted.
    status, _, _ = _send(daemon, "GET", "/_/status")
    assert status == 200
    own = urllib.request.Request(
        daemon.url + "/_/prefetch",
        b'{"urls": ["/web/s_000.tar"]}',
        {"Origin": daemon.url, "Sec-Fetch-Site": "same-origin"},
        method="POST",
    )
    with urllib.request.urlopen(own, timeout=10) as response:
        assert response.status == 202
    assert _send(daemon, "POST", "/_/prefetch", b'{"urls": ["/web/s_000.tar"]}')[0] == 202


@pytest.mark.parametrize(
    ("host", "answered"),
    [
        ("evil.example:{port}", 403),  # a name re-pointed at 127.0.0.1: DNS rebinding
        ("127.0.0.1.evil.example:{port}", 403),
        ("10.0.0.1:{port}", 403),
        ("localhost:{port}", 200),
        ("LOCALHOST.:{port}", 200),
        ("127.0.0.1:{port}", 200),
        ("127.0.0.1", 200),
    ],
)
def test_a_loopback_daemon_answers_only_to_loopback_host_names(
    host: str, answered: int, origin: OriginServer, start_daemon
) -> None:
    """A page on evil.example whose DNS is re-pointed at 127.0.0.1 makes the browser send
    `Host` and `Origin` of evil.example: same-origin by the headers, so it could read shards
    fetched with the node's credentials, the status and origins, and purge (the re-attack).
    A loopback daemon refuses any Host but its loopback names, on every path; curl, the client
    and the commands send 127.0.0.1 or localhost."""
    origin.put("s_000.tar", b"x" * 4096)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    port = daemon.url.rsplit(":", 1)[1]
    for path in ("/web/s_000.tar", "/_/status"):
        request = urllib.request.Request(
            daemon.url + path, headers={"Host": host.format(port=port)}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        assert status == answered, (path, host, body[:200])
        if status == 403:
            assert "rebinding" in json.loads(body)["error"]
    if answered == 403:
        assert sum(origin.gets.values()) == 0  # nothing was fetched for the page
