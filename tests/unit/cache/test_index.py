"""The diskcache adapter against the installed diskcache: the `Cache` table's schema and the `Disk`
seam it relies on (private to diskcache, so an upgrade may change them without notice; this is
where that shows), then one round trip through every query it sends. Temp dir, no sockets."""

from __future__ import annotations

import contextlib
import inspect
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import diskcache
import diskcache.core
import pytest

from shardcache.cache.index import COLUMNS_USED, AdoptFile, Index
from shardcache.errors import CacheError


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    opened = Index(tmp_path / "index")
    opened.add_access_time_index()
    yield opened
    opened.close()


def _adopt(index: Index, tmp_path: Path, key: str, data: bytes) -> None:
    partial = tmp_path / f"partial-{len(os.listdir(tmp_path))}"
    partial.write_bytes(data)
    index.set(key, AdoptFile(str(partial), len(data)), f"tag of {key}")


def test_the_cache_table_has_the_columns_the_adapter_reads(index: Index) -> None:
    with contextlib.closing(sqlite3.connect(index.directory / "cache.db")) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(Cache)")}
        indexes = {row[1] for row in db.execute("PRAGMA index_list(Cache)")}
    assert set(COLUMNS_USED) <= columns, (
        f"diskcache's Cache table lost {set(COLUMNS_USED) - columns}"
    )
    assert "Cache_access_time" in indexes  # least_recently_used is one ordered scan


def test_the_disk_seam_is_the_one_the_adapter_overrides(index: Index) -> None:
    """`_AdoptingDisk` overrides `store` and `fetch` and calls `filename`, `remove` and
    `_directory`; `Index` calls the Cache's private `_sql` and `_disk`."""
    parameters = {
        name: list(inspect.signature(getattr(diskcache.Disk, name)).parameters)
        for name in ("store", "fetch", "filename", "remove")
    }
    assert parameters == {
        "store": ["self", "value", "read", "key"],
        "fetch": ["self", "mode", "filename", "value", "read"],
        "filename": ["self", "key", "value"],
        "remove": ["self", "file_path"],
    }
    assert isinstance(diskcache.core.MODE_BINARY, int)
    cache = index._cache  # the adapter's own test: the private parts of diskcache it uses
    assert isinstance(cache._disk, diskcache.Disk)
    assert cache._disk._directory == str(index.directory)
    assert cache._sql("SELECT count(*) FROM Cache").fetchall() == [(0,)]


def test_every_query_round_trips(index: Index, tmp_path: Path) -> None:
    _adopt(index, tmp_path, "b", b"bb")
    _adopt(index, tmp_path, "a", b"a")
    _adopt(index, tmp_path, "c", b"ccc")
    assert len(index) == 3 and index.entry_bytes() == 6
    assert sorted(index.keys()) == ["a", "b", "c"]
    fd, tag = index.get("a")
    assert fd is not None and os.pread(fd, 10, 0) == b"a" and tag == "tag of a"
    os.close(fd)
    assert index.get("missing") == (None, None)
    assert index.tag_of("c") == "tag of c" and index.tag_of("missing") is None
    assert index.size_of("b") == 2 and index.size_of("missing") is None

    index.write_access_times({"b": 3e9, "a": 2e9})  # c was stored now: oldest
    assert index.least_recently_used(2) == [("c", 3), ("a", 1)]
    rows = index.rows()
    assert [key for key, _, _ in rows] == ["b", "a", "c"]
    files = {key: filename for key, filename, _ in rows}
    assert all((index.directory / name).is_file() for name in files.values())
    first, *_ = index.rows_after(0, 1)
    assert first[1:3] == ("b", files["b"]) and first[4] == "tag of b"
    assert [key for _, key, _, _, _ in index.rows_after(first[0], 10)] == ["a", "c"]
    assert [row[0] for row in index.key_range("a", "a", "c", 10)] == ["b"]
    assert index.key_range("a", "", "z", 10)[0][3] == 2e9  # access_time as written

    assert not index.delete_if_file("a", "another-version")
    assert index.delete_if_file("a", files["a"]) and index.size_of("a") is None
    assert not (index.directory / files["a"]).exists()  # the file goes after the row
    assert index.delete_to_free_space("b") and not index.delete("b")
    assert index.check(fix=False) == []


def test_a_failed_set_leaves_no_orphan_in_the_index_tree(index: Index, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.write_bytes(b"xyz")
    adopt = AdoptFile(str(partial), 3)
    with contextlib.closing(sqlite3.connect(index.directory / "cache.db")) as db, db:
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON Cache BEGIN SELECT RAISE(ABORT, 'no'); END"
        )
    with pytest.raises(sqlite3.Error):
        index.set("k", adopt, "tag")
    assert adopt.adopted_as is not None and os.path.exists(adopt.adopted_as)  # moved, no row
    index.drop_unindexed(adopt)
    assert not os.path.exists(adopt.adopted_as)
    assert index.check(fix=False) == []


def test_vendor_errors_become_cache_errors(index: Index) -> None:
    from shardcache.cache.index import map_store_errors

    with pytest.raises(CacheError, match="the index failed"), map_store_errors("listing"):
        raise sqlite3.OperationalError("database or disk is full")
    with pytest.raises(CacheError, match="x: the index failed"), map_store_errors("x"):
        raise diskcache.Timeout()


def test_a_row_an_eviction_on_a_full_disk_could_not_delete_goes_at_the_next_write(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found under load in CI: on a disk filled to the last block, eviction removes the
    victim's file first; when another fill took the freed blocks before SQLite could record
    the deletion, the row stayed, naming no file, and `shardcache verify` reported it. Fault
    injection at the SQLite edge (a real ENOSPC for the row alone cannot be arranged while
    the file's blocks are free)."""
    _adopt(index, tmp_path, "victim", b"v" * 100)
    _adopt(index, tmp_path, "other", b"o")
    real_delete = index._cache.delete
    failures = iter([True, True])  # the first delete, and the one after the file went

    def full_disk_delete(key: str, retry: bool = False) -> bool:
        if next(failures, False):
            raise sqlite3.OperationalError("database or disk is full")
        return bool(real_delete(key, retry=retry))

    monkeypatch.setattr(index._cache, "delete", full_disk_delete)
    assert index.delete_to_free_space("victim")  # its file is gone, its space free
    assert index.get("victim") == (None, None)  # the row left over reads as a miss
    assert sorted(index.keys()) == ["other", "victim"]
    _adopt(index, tmp_path, "new", b"n")  # the next write: room again
    assert sorted(index.keys()) == ["new", "other"] and index.check(fix=False) == []


def test_a_left_over_row_is_not_dropped_once_its_key_was_filled_again(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _adopt(index, tmp_path, "k", b"old")
    real_delete = index._cache.delete
    failures = iter([True, True])

    def full_disk_delete(key: str, retry: bool = False) -> bool:
        if next(failures, False):
            raise sqlite3.OperationalError("database or disk is full")
        return bool(real_delete(key, retry=retry))

    monkeypatch.setattr(index._cache, "delete", full_disk_delete)
    index.delete_to_free_space("k")
    monkeypatch.setattr(index._cache, "set", _set_without_dropping(index))
    _adopt(index, tmp_path, "k", b"new")  # indexed again before the left-over row went
    monkeypatch.undo()
    index.close()  # drops left-over rows only where they still name the removed file
    reopened = Index(index.directory)
    fd, _ = reopened.get("k")
    assert fd is not None and os.pread(fd, 10, 0) == b"new"
    os.close(fd)
    assert reopened.check(fix=False) == []
    reopened.close()


def _set_without_dropping(index: Index):  # type: ignore[no-untyped-def]
    """diskcache's own `set`, as it is: `Index.set` drops left-over rows first, and this
    test needs the new row to land while the old one is still listed."""
    real_set = index._cache.set
    rows_to_drop = dict(index._rows_to_drop)

    def set_keeping_the_list(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = real_set(*args, **kwargs)
        index._rows_to_drop.update(rows_to_drop)
        return result

    return set_keeping_the_list


# -- rows remembered for the event loop (`get_remembered`) --------------------------------------


def _read(opened: tuple[int, object] | None) -> tuple[bytes, object] | None:
    if opened is None:
        return None
    fd, tag = opened
    try:
        return os.pread(fd, 100, 0), tag
    finally:
        os.close(fd)


def test_a_row_is_remembered_once_set_wrote_it_or_get_read_it(index: Index, tmp_path: Path) -> None:
    """A committed fill's row is remembered as it is written (its first hit needs no SQLite,
    so the hit lane answers it); a row only read is remembered by `get`."""
    _adopt(index, tmp_path, "k", b"one")
    assert _read(index.get_remembered("k")) == (b"one", "tag of k")
    assert _read(index.get_remembered("other")) is None
    reopened = Index(index.directory)  # as after a restart: nothing remembered
    try:
        assert reopened.get_remembered("k") is None  # SQLite must be asked
        assert _read(reopened.get("k")) == (b"one", "tag of k")
        assert _read(reopened.get_remembered("k")) == (b"one", "tag of k")
    finally:
        reopened.close()


def test_every_write_forgets_what_it_changes(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge or a refetch must never be answered from a remembered row: a set remembers
    only the row it wrote; delete, delete_if_file, delete_to_free_space and check each forget
    the keys they touch. The old files are left in place here (a removal that failed, or has
    not happened yet), so only the forgetting stands between a reader and the old bytes."""
    monkeypatch.setattr(index._cache._disk, "remove", lambda *_: None)
    _adopt(index, tmp_path, "k", b"one")
    _read(index.get("k"))
    _adopt(index, tmp_path, "k", b"two")  # a new version under the same key
    assert _read(index.get_remembered("k")) == (b"two", "tag of k")
    assert _read(index.get("k")) == (b"two", "tag of k")
    assert index.delete("k")
    assert index.get_remembered("k") is None and index.get("k") == (None, None)

    _adopt(index, tmp_path, "k", b"three")
    _read(index.get("k"))
    assert index.delete_if_file("k", str(index.filename_of("k")))
    assert index.get_remembered("k") is None

    _adopt(index, tmp_path, "k", b"four")
    _read(index.get("k"))
    assert index.delete_to_free_space("k")
    assert index.get_remembered("k") is None

    _adopt(index, tmp_path, "k", b"five")
    _read(index.get("k"))
    index.check(fix=False)
    assert index.get_remembered("k") is None


def test_a_remembered_row_whose_file_went_is_forgotten(index: Index, tmp_path: Path) -> None:
    """A file removed behind the index's back (or the cache dir deleted) is not served: the
    row is forgotten and `get` decides."""
    _adopt(index, tmp_path, "k", b"one")
    _read(index.get("k"))
    os.remove(index.directory / str(index.filename_of("k")))
    assert index.get_remembered("k") is None
    assert index.get("k") == (None, None)


def test_a_fifo_where_a_remembered_file_was_does_not_block(index: Index, tmp_path: Path) -> None:
    _adopt(index, tmp_path, "k", b"one")
    _read(index.get("k"))
    path = index.directory / str(index.filename_of("k"))
    os.remove(path)
    os.mkfifo(path)
    assert index.get_remembered("k") is None  # opened O_NONBLOCK, refused as no regular file


def test_remembered_rows_are_bounded(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shardcache.cache.index.REMEMBERED_ROWS", 3)
    for n in range(5):
        _adopt(index, tmp_path, f"k{n}", b"x")
        _read(index.get(f"k{n}"))
    remembered = [n for n in range(5) if _read(index.get_remembered(f"k{n}")) is not None]
    assert remembered == [2, 3, 4]  # the oldest went first


def test_another_threads_get_between_the_memorys_steps_never_fails_a_lookup(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`get` runs on worker threads, several at once, and on a dataset of more keys than the
    memory holds each `get` drops the oldest row. Another thread's `get` remembering its row
    in the middle of that drop must cost nothing: a RuntimeError ("dictionary changed size
    during iteration") left the store as a 500 for a hit. Here that thread's write lands
    exactly where the GIL may hand over to it, between the memory's steps."""
    monkeypatch.setattr("shardcache.cache.index.REMEMBERED_ROWS", 1)
    _adopt(index, tmp_path, "a", b"one")
    _adopt(index, tmp_path, "b", b"two")
    _read(index.get("a"))
    memory = index._remembered
    kind = type(memory)

    class Racing(kind):  # type: ignore[valid-type,misc]
        def __iter__(self):  # type: ignore[no-untyped-def]
            iterator = kind.__iter__(self)
            kind.__setitem__(self, "another thread's key", ("/gone", "its tag"))
            return iterator

    monkeypatch.setattr(index, "_remembered", Racing(memory))
    assert _read(index.get("b")) == (b"two", "tag of b")
    assert _read(index.get_remembered("b")) == (b"two", "tag of b")
