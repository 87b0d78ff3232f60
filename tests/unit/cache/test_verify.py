"""`shardcache verify`: entries filled through the real core, then damaged on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardcache import cli
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.cache.verify import verify_cache
from shardcache.errors import CacheError
from shardcache.observer import NullObserver
from tests.unit.cache.test_shard_cache import read_all, settle
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024


async def _fill(directory: Path, objects: dict[str, tuple[bytes, bool]]) -> dict[str, Path]:
    """Cache `objects` (key → (data, publishes an MD5)); return each entry's file."""
    origin = FakeOrigin()
    store = Store(directory, 64 * MiB)
    cache = ShardCache(store, {"fake": origin}, make_policy(), NullObserver())
    for key, (data, with_md5) in objects.items():
        origin.put(key, data, with_md5=with_md5)
        assert await read_all(await cache.open("fake", key)) == data
        await settle(cache)
    await cache.aclose()
    files = {key.rsplit("/", 1)[1]: path for key, path, _ in store.walks.entries()}
    for _, _, meta in store.walks.entries():  # what each entry was verified against is recorded
        assert meta is not None and "length" in meta.verified_by and meta.digests
    store.close()
    return files


@pytest.fixture
async def cached(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    directory = tmp_path / "cache"
    files = await _fill(
        directory,
        {
            "md5.tar": (os.urandom(MiB), True),  # verified against Content-MD5
            "plain.tar": (os.urandom(MiB), False),  # no checksum: a local CRC-32C is kept
            "third.tar": (os.urandom(1000), True),
        },
    )
    return directory, files


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 1]))


def test_a_sound_cache_is_clean(cached: tuple[Path, dict[str, Path]]) -> None:
    directory, _ = cached
    report = verify_cache(directory)
    assert report.is_clean and report.entries == 3
    assert report.digest_checked == 3 and report.checked_bytes == 2 * MiB + 1000


def test_damage_is_found_and_repair_drops_it(cached: tuple[Path, dict[str, Path]]) -> None:
    directory, files = cached
    _flip(files["md5.tar"], 12345)
    _flip(files["plain.tar"], MiB - 1)
    os.truncate(files["third.tar"], 10)
    (directory / "v1" / "partial" / "leftover").write_bytes(b"x")
    orphan = files["md5.tar"].parent / "orphan.val"
    orphan.write_bytes(b"y")

    report = verify_cache(directory)
    kinds = sorted(p.kind for p in report.problems)
    assert kinds == ["corrupt", "corrupt", "index", "wrong_size"], report.problems
    assert [Path(p).name for p in report.partial_files] == ["leftover"]  # listed, not damage
    assert {p.key for p in report.problems if p.kind == "corrupt"} == {
        "fake://fake/md5.tar",
        "fake://fake/plain.tar",
    }

    repaired = verify_cache(directory, repair=True)
    assert repaired.repaired and not repaired.is_clean  # it reports what it found
    after = verify_cache(directory)
    assert after.is_clean and after.entries == 0 and after.partial_files == []
    assert not orphan.exists()


def test_the_command_line_exit_status_and_json(
    cached: tuple[Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, files = cached
    assert cli.main(["verify", "--cache-dir", str(directory)]) == 0
    assert "no damage found" in capsys.readouterr().out

    _flip(files["plain.tar"], 0)
    assert cli.main(["verify", "--cache-dir", str(directory), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["clean"] is False and document["problems"][0]["kind"] == "corrupt"

    assert cli.main(["verify", "--cache-dir", str(directory), "--repair"]) == 1
    assert cli.main(["verify", "--cache-dir", str(directory)]) == 0
    capsys.readouterr()


def test_the_command_line_refuses_what_it_cannot_check(
    tmp_path: Path, cached: tuple[Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["verify", "--cache-dir", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    assert cli.main(["verify", "--cache-dir", str(tmp_path / "other"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"].endswith("holds no shardcache cache")
    assert not (tmp_path / "other" / "v1").exists()  # nothing written into a stranger's dir
    directory, _ = cached
    running = Store(directory, MiB)  # a daemon holds the directory
    try:
        assert cli.main(["verify", "--cache-dir", str(directory)]) == 2
        error = capsys.readouterr().err
        assert "in use by another shardcache daemon" in error and error.count("\n") == 1
        with pytest.raises(CacheError):
            verify_cache(directory)
    finally:
        running.close()
