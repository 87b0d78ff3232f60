"""Offline verification of a cache directory (`shardcache verify`): each entry's length and
digest kept at commit, and the index against the files on disk; `repair` drops what is damaged.

With a daemon holding the store's lock, `verify_cache` raises CacheInUse (`cli` then asks the
daemon's scrub, `POST /_/verify`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from shardcache.cache.directory import LAYOUT_VERSION
from shardcache.cache.entry import EntryMeta
from shardcache.cache.store import Store
from shardcache.checksums import Algorithm, Checksum, Verifier, from_headers
from shardcache.errors import CacheInUse as CacheInUse  # for `cli`: a running daemon holds it
from shardcache.errors import IntegrityError

ProblemKind = Literal["corrupt", "wrong_size", "missing_file", "bad_metadata", "index"]
READ_BYTES = 4 << 20
_ALGORITHMS: frozenset[str] = frozenset(  # a per-part one needs its part size, which is not kept
    a for a in get_args(Algorithm) if not a.endswith("-parts")
)


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    detail: str
    key: str | None = None


@dataclass(slots=True)
class Report:
    directory: str
    entries: int = 0
    checked_bytes: int = 0
    digest_checked: int = 0  # entries whose bytes were hashed against a kept digest
    length_only: int = 0  # entries with no digest to check (committed by an older version)
    problems: list[Problem] = field(default_factory=list)
    # Fills a crash interrupted: not damage (the daemon sweeps them at start), but listed.
    partial_files: list[str] = field(default_factory=list)
    repaired: bool = False

    @property
    def is_clean(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"clean": self.is_clean}


def verify_cache(
    directory: Path, repair: bool = False, on_bytes: Callable[[int], None] | None = None
) -> Report:
    """Check every entry under `directory` and return what was found (and, with `repair`,
    dropped). `on_bytes(n)` is told of each n bytes read, for a progress bar.

    Raises CacheError when the directory holds no cache or a running daemon holds it.
    """
    store = Store(directory, 0, repair=False)
    try:
        report = Report(str(directory))
        damaged: dict[str, Path] = {}
        for key, path, meta in store.walks.entries():
            report.entries += 1
            problem = _check_entry(key, path, meta, report, on_bytes)
            if problem is not None:
                report.problems.append(problem)
                damaged[key] = path
        named = {str(path) for path in damaged.values()}
        for message in store.walks.index_problems(fix=False):
            if not any(path in message for path in named):  # reported above already
                report.problems.append(Problem("index", message))
        partials = store.walks.partial_files()
        report.partial_files = [str(p) for p in partials]
        if repair and (report.problems or partials):
            for key in damaged:
                store.delete(key)
            for _ in range(3):  # a removed file can leave an empty directory for the next pass
                if not store.walks.index_problems(fix=True):
                    break
            for leftover in partials:
                leftover.unlink(missing_ok=True)
            report.repaired = bool(report.problems)
        return report
    finally:
        store.close()


def expected_checksums(meta: EntryMeta) -> tuple[Checksum, ...]:
    """What the entry's bytes must hash to: kept digests, then republished checksums."""
    found: dict[str, Checksum] = {}
    for algorithm, hex_digest in meta.digests.items():
        if algorithm in _ALGORITHMS:
            digest = bytes.fromhex(hex_digest)
            found[algorithm] = Checksum(algorithm, digest, "entry digest")  # type: ignore[arg-type]
    published = {name.lower(): value for name, value in meta.checksum_headers.items()}
    for checksum in from_headers(published):
        found.setdefault(checksum.algorithm, checksum)
    return tuple(found.values())


def _check_entry(
    key: str,
    path: Path,
    meta: EntryMeta | None,
    report: Report,
    on_bytes: Callable[[int], None] | None,
) -> Problem | None:
    if meta is None:
        return Problem("bad_metadata", "the index row's metadata is unreadable", key)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return Problem("missing_file", f"{path} is missing", key)
    if size != meta.size_bytes:
        return Problem("wrong_size", f"{path} has {size} bytes, expected {meta.size_bytes}", key)
    try:
        expected = expected_checksums(meta)
    except ValueError as exc:  # a digest that is not hex
        return Problem("bad_metadata", f"unreadable digest: {exc}", key)
    if not expected:
        report.length_only += 1
        return None
    verifier = Verifier(expected)
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(READ_BYTES):
            verifier.update(chunk)
            report.checked_bytes += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    report.digest_checked += 1
    try:
        verifier.verify()
    except IntegrityError as exc:
        return Problem("corrupt", str(exc), key)
    return None


def total_bytes(directory: Path) -> int:
    """The bytes a verification of `directory` will read (for a progress bar's total)."""
    index = directory / LAYOUT_VERSION / "index"
    total = 0
    for root, _, files in os.walk(index):
        total += sum(
            os.stat(os.path.join(root, f)).st_size for f in files if not f.startswith("cache.db")
        )
    return total
