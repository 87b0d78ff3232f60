"""Hostile origins, through the daemon as users start it: a file origin's links never lead out
of its root, and an HTTP origin's redirects never fetch another host's bytes as a shard."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import curl, sha256
from tests.origin_server import OriginServer

SECRET = b"SECRET: outside the origin, never to be served\n" * 100
INSIDE = os.urandom(200_000)


def _get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    """Status, Content-Type and body, also for an error (curl -f drops an error's body)."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _post_prefetch(daemon, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        daemon.url + "/_/prefetch", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def _wait_prefetch_idle(daemon, settled: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = daemon.get_json("/_/prefetch")[1]
        if status["done"] + status["failed"] >= settled and status["in_flight"] == 0:
            return
        assert time.monotonic() < deadline, f"prefetch did not settle: {status}"
        time.sleep(0.05)


def _files_holding(directory: Path, needle: bytes) -> list[Path]:
    return [
        path
        for path in directory.rglob("*")
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes()
    ]


# Each link: (key to ask for, link path in the root, link target). Targets starting with "@"
# are relative to the test's tmp dir (absolute links); others are written as they are.
OUTSIDE_LINKS = {
    "absolute /etc/passwd": ("passwd", "passwd", "/etc/passwd"),
    "absolute, to a file": ("abs.tar", "abs.tar", "@outside/secret.tar"),
    "relative ../../": ("sub/rel.tar", "sub/rel.tar", "../../outside/secret.tar"),
    "directory link": ("dirlink/secret.tar", "dirlink", "@outside"),
    "chain ending outside": ("chain1.tar", "chain1.tar", "sub/chain2.tar"),
}
EXTRA_LINKS = {"sub/chain2.tar": "../chain3.tar", "chain3.tar": "@outside/secret.tar"}
INSIDE_LINKS = {
    "relative, inside": ("in_rel.tar", "in_rel.tar", "real/shard.tar"),
    "directory, inside": ("in_dir/shard.tar", "in_dir", "real"),
}


@pytest.fixture
def file_root(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.tar").write_bytes(SECRET)
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "real" / "shard.tar").write_bytes(INSIDE)
    links = [(link, target) for _, link, target in OUTSIDE_LINKS.values()]
    links += [(link, target) for _, link, target in INSIDE_LINKS.values()]
    links += list(EXTRA_LINKS.items())
    for link, target in links:
        os.symlink(str(tmp_path / target[1:]) if target.startswith("@") else target, root / link)
    yield root


@pytest.mark.parametrize("case", OUTSIDE_LINKS)
def test_a_link_out_of_a_file_origin_is_404_never_the_bytes(
    file_root: Path, start_daemon, case: str
) -> None:
    key = OUTSIDE_LINKS[case][0]
    outside = Path(OUTSIDE_LINKS[case][2]) if case.endswith("passwd") else None
    forbidden = outside.read_bytes()[:64] if outside and outside.exists() else SECRET[:64]
    daemon = start_daemon({"files": f"file://{file_root}"}, "--readahead", "0")

    result = curl(f"{daemon.url}/files/{key}")
    assert result.status == 404 and forbidden not in result.body
    status, content_type, body = _get(f"{daemon.url}/files/{key}")
    assert (status, content_type) == (404, "application/json; charset=utf-8")
    missing = _get(f"{daemon.url}/files/no-such-{key.replace('/', '-')}")[2]
    # The same answer as for a key that does not exist: nothing about what lies outside.
    assert json.loads(body) == {"error": f"{file_root}/{key} does not exist"}
    assert json.loads(missing)["error"].endswith("does not exist")
    assert forbidden not in body
    assert _get(f"{daemon.url}/files/{key}", method="HEAD")[0] == 404
    assert _files_holding(daemon.cache_dir, forbidden) == []


def test_prefetching_links_out_of_the_root_caches_nothing(file_root: Path, start_daemon) -> None:
    daemon = start_daemon({"files": f"file://{file_root}"}, "--readahead", "0")
    outside_keys = [key for key, _, _ in OUTSIDE_LINKS.values()]
    inside_keys = [key for key, _, _ in INSIDE_LINKS.values()]

    _post_prefetch(daemon, {"origin": "files", "keys": outside_keys + inside_keys})
    _wait_prefetch_idle(daemon, settled=len(outside_keys) + len(inside_keys))

    again = _post_prefetch(daemon, {"origin": "files", "keys": outside_keys})
    assert again["cached"] == 0
    assert _post_prefetch(daemon, {"origin": "files", "keys": inside_keys})["cached"] == 2
    assert _files_holding(daemon.cache_dir, SECRET[:64]) == []
    assert _files_holding(daemon.cache_dir, Path("/etc/passwd").read_bytes()[:64]) == []
    for key in outside_keys:
        assert curl(f"{daemon.url}/files/{key}").status == 404


@pytest.mark.parametrize("case", INSIDE_LINKS)
def test_a_link_that_stays_inside_the_root_is_served(
    file_root: Path, start_daemon, case: str
) -> None:
    daemon = start_daemon({"files": f"file://{file_root}"}, "--readahead", "0")
    key = INSIDE_LINKS[case][0]
    first = curl(f"{daemon.url}/files/{key}")
    again = curl(f"{daemon.url}/files/{key}")
    assert (first.status, first.sha256) == (200, sha256(INSIDE))
    assert (again.headers["x-shardcache"], again.sha256) == ("hit", sha256(INSIDE))


@pytest.fixture
def elsewhere() -> Iterator[OriginServer]:
    """Another host (another port on loopback) holding what must never be served."""
    server = OriginServer()
    server.start()
    server.put("secret", SECRET)
    yield server
    server.stop()


def _config(tmp_path: Path, url: str, follow: bool) -> str:
    path = tmp_path / "shardcache.toml"
    path.write_text(f'[origins.web]\nurl = "{url}"\nfollow_redirects = {str(follow).lower()}\n')
    return str(path)


@pytest.mark.parametrize("follow", [False, True], ids=["default", "follow_redirects"])
def test_a_redirect_to_another_host_is_502_never_its_bytes(
    origin: OriginServer, elsewhere: OriginServer, start_daemon, tmp_path: Path, follow: bool
) -> None:
    origin.put("s_000.tar", b"not this", redirect_to=f"{elsewhere.url}/secret")
    if follow:
        daemon = start_daemon(
            {}, "--readahead", "0", "--config", _config(tmp_path, origin.url, True)
        )
    else:  # the default, as most users start it
        daemon = start_daemon({"web": origin.url}, "--readahead", "0")

    result = curl(f"{daemon.url}/web/s_000.tar")
    status, content_type, body = _get(f"{daemon.url}/web/s_000.tar")

    assert result.status == 502 and SECRET[:64] not in result.body
    assert (status, content_type) == (502, "application/json; charset=utf-8")
    assert f"127.0.0.1:{elsewhere.port}" in json.loads(body)["error"]
    assert SECRET[:64] not in body
    assert elsewhere.gets["secret"] == elsewhere.heads["secret"] == 0
    assert _files_holding(daemon.cache_dir, SECRET[:64]) == []


@pytest.mark.parametrize("location", ["/s_001.tar", "{url}/s_001.tar"], ids=["path", "absolute"])
def test_a_same_host_redirect_is_followed_only_when_the_origin_allows_it(
    origin: OriginServer, start_daemon, tmp_path: Path, location: str
) -> None:
    data = os.urandom(300_000)
    origin.put("s_000.tar", b"not this", redirect_to=location.format(url=origin.url))
    origin.put("s_001.tar", data)
    off = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=tmp_path / "off")
    on = start_daemon(
        {},
        "--readahead",
        "0",
        "--config",
        _config(tmp_path, origin.url, True),
        cache_dir=tmp_path / "on",
    )

    refused = _get(f"{off.url}/web/s_000.tar")
    assert refused[0] == 502 and "not followed" in json.loads(refused[2])["error"]
    assert f"127.0.0.1:{origin.port}" in json.loads(refused[2])["error"]
    served = curl(f"{on.url}/web/s_000.tar")
    assert (served.status, served.sha256) == (200, sha256(data))
    ranged = curl(f"{on.url}/web/s_000.tar", "-H", "Range: bytes=1000-1999")
    assert (ranged.status, ranged.body) == (206, data[1000:2000])
