"""Origin edges without sockets: a file origin never leaves its root, and which redirects an
HTTP origin may follow."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from shardcache.config import OriginSpec
from shardcache.errors import OriginNotFound, OriginRedirected
from shardcache.origins.file import FileOrigin, open_beneath, resolve_inside
from shardcache.origins.http import redirect_target

SECRET = b"outside the root: never served\n"
INSIDE = b"a shard inside the root\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/outside/{secret, dir/secret}, and tmp/root with links of every kind."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_bytes(SECRET)
    (outside / "dir" / "secret").write_bytes(SECRET)
    root = tmp_path / "root"
    (root / "real" / "deep").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "real" / "shard.tar").write_bytes(INSIDE)
    (root / "real" / "deep" / "shard.tar").write_bytes(INSIDE)
    links = {
        "absolute": outside / "secret",
        "sub/relative": "../../outside/secret",
        "dirlink": outside / "dir",
        "chain1": "chain2",
        "chain2": "sub/chain3",
        "sub/chain3": "../../outside/secret",
        "dangling_out": outside / "missing",
        "loop": "loop",
        "rootlink": ".",
        "in_relative": "real/shard.tar",
        "in_absolute": root / "real" / "shard.tar",
        "in_dir": "real",
        "sub/in_chain": "../in_relative",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    return root


OUTSIDE_KEYS = [
    "absolute",
    "sub/relative",
    "dirlink/secret",
    "chain1",
    "dangling_out",
    "loop",
    "rootlink",
    "rootlink/absolute",
]
INSIDE_KEYS = [
    "real/shard.tar",
    "in_relative",
    "in_absolute",
    "in_dir/deep/shard.tar",
    "sub/in_chain",
]


def _origin(root: Path) -> FileOrigin:
    return FileOrigin(OriginSpec("files", f"file://{root}"))


@pytest.mark.parametrize("key", OUTSIDE_KEYS)
async def test_links_out_of_the_root_read_as_missing(tree: Path, key: str) -> None:
    origin = _origin(tree)
    with pytest.raises(OriginNotFound) as head_error:
        await origin.head(key)
    with pytest.raises(OriginNotFound) as open_error:
        await origin.open(key)
    # One answer for every refusal, so it says nothing about what exists outside.
    assert key in str(head_error.value) and str(open_error.value) == str(head_error.value)
    assert "outside" not in str(head_error.value)


@pytest.mark.parametrize("key", INSIDE_KEYS)
async def test_links_that_stay_inside_the_root_are_followed(tree: Path, key: str) -> None:
    origin = _origin(tree)
    info = await origin.head(key)
    stream = await origin.open(key, start=2, if_match=info.etag)
    try:
        body = b"".join([chunk async for chunk in stream])
    finally:
        await stream.aclose()
    assert info.size_bytes == len(INSIDE) and body == INSIDE[2:]


async def test_a_root_that_is_itself_a_link_is_followed(tree: Path) -> None:
    os.symlink(tree, tree.parent / "current")
    origin = _origin(tree.parent / "current")
    assert (await origin.head("in_relative")).size_bytes == len(INSIDE)
    with pytest.raises(OriginNotFound):
        await origin.head("absolute")


def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(tree: Path) -> None:
    resolved = resolve_inside(tree, "real/deep/shard.tar")
    assert resolved is not None
    # The race: after the real path was checked, real/deep becomes a link out of the root.
    (tree / "real" / "deep" / "shard.tar").unlink()
    (tree / "real" / "deep").rmdir()
    os.symlink(tree.parent / "outside" / "dir", tree / "real" / "deep")
    os.rename(
        tree.parent / "outside" / "dir" / "secret", tree.parent / "outside" / "dir" / "shard.tar"
    )
    with pytest.raises(OSError) as error:
        os.close(open_beneath(*resolved))
    # Linux says ENOTDIR for O_DIRECTORY|O_NOFOLLOW on a link; either way, refused.
    assert error.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_a_file_swapped_for_a_link_after_the_check_is_not_followed(tree: Path) -> None:
    resolved = resolve_inside(tree, "real/shard.tar")
    assert resolved is not None
    (tree / "real" / "shard.tar").unlink()
    os.symlink(tree.parent / "outside" / "secret", tree / "real" / "shard.tar")
    with pytest.raises(OSError) as error:
        os.close(open_beneath(*resolved))
    assert error.value.errno == errno.ELOOP  # refused, not merely missing


def test_resolve_inside_refuses_the_root_and_its_neighbours(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root-evil").mkdir()  # shares the root's name as a string prefix
    os.symlink(tmp_path / "root-evil", tmp_path / "root" / "link")
    assert resolve_inside(tmp_path / "root", "link/x") is None
    assert resolve_inside(tmp_path / "root", ".") is None


ORIGIN = "http://data.example:8080/shards"


@pytest.mark.parametrize(
    ("location", "follow", "expected"),
    [
        ("/shards/b.tar", True, "http://data.example:8080/shards/b.tar"),
        ("b.tar", True, "http://data.example:8080/shards/b.tar"),
        ("http://DATA.example:8080/x.tar", True, "http://DATA.example:8080/x.tar"),
        ("http://data.example:8080/secret", False, "not followed"),
        ("/shards/b.tar", False, "not followed"),
        ("http://other.example:8080/secret", True, "another host, other.example:8080"),
        ("http://data.example:9090/secret", True, "another host, data.example:9090"),
        ("https://data.example:8080/secret", True, "another host"),
        ("http://data.example/secret", True, "another host"),
        ("//other.example/secret", True, "another host, other.example"),
        ("http://data.example:99999/x", True, "unusable"),
    ],
)
def test_redirect_target(location: str, follow: bool, expected: str) -> None:
    url = f"{ORIGIN}/a.tar"
    within = ORIGIN if follow else None
    if expected.startswith("http"):
        assert redirect_target(url, 302, location, url, within) == expected
    else:
        with pytest.raises(OriginRedirected, match=expected):
            redirect_target(url, 302, location, url, within)


def test_redirect_target_default_ports_and_missing_location() -> None:
    https = "https://cdn.example/shards"
    assert redirect_target(f"{https}/a", 301, "https://cdn.example:443/b", "a", https).endswith(
        ":443/b"
    )
    for status, location in ((302, None), (300, "/b"), (304, "/b")):
        with pytest.raises(OriginRedirected, match=f"answered {status}"):
            redirect_target(f"{https}/a", status, location, "a", https)


@pytest.mark.parametrize(
    "value",
    [
        "01 Jan 1970 00:00:00 +99999999999999999999",  # found by the attack: OverflowError
        "Mon, 99 Zzz 99999 99:99:99 GMT",
        "",
    ],
)
def test_an_unreadable_last_modified_is_no_validator(value: str) -> None:
    from shardcache.origins.responses import last_modified as _last_modified

    assert _last_modified(value) is None
