"""Replay shard access traces through eviction and admission policies (pure Python, no network).

    python benchmarks/trace_sim.py             # the table for BENCHMARKS.md
    python benchmarks/trace_sim.py --shards 200 --epochs 6

Traces (N shards, E epochs, one request per shard and epoch and reader):
  sequential   one job, the same order every epoch
  reshuffled   one job, a fresh shuffle every epoch
  8-workers    one job, a fresh shuffle split across 8 workers, their reads interleaved
  two-jobs     two jobs over the same shards, different shuffles, one reading twice as fast
  node-of-4    the shard list reshuffled each epoch, then split by node: this node's quarter
Policies: `lru` (admit everything, evict least recently used), `scan-resistant`
(`shardcache.admission`: spare recently read entries, stream the new fill through instead),
and `belady` (the offline optimum with bypass: admit only when the new shard is needed again
before the resident needed furthest away). Shards are the same size, the cache holds C of them.
The hit ratio counts epochs 2 onwards.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardcache.admission import ScanResistantAdmission  # noqa: E402

Trace = list[tuple[int, str]]  # (epoch, key)


def sequential(n: int, epochs: int, rng: random.Random) -> Trace:
    return [(e, f"s{i}") for e in range(epochs) for i in range(n)]


def reshuffled(n: int, epochs: int, rng: random.Random) -> Trace:
    trace: Trace = []
    for e in range(epochs):
        order = [f"s{i}" for i in range(n)]
        rng.shuffle(order)
        trace += [(e, key) for key in order]
    return trace


def workers(n: int, epochs: int, rng: random.Random, count: int = 8) -> Trace:
    trace: Trace = []
    for e in range(epochs):
        order = [f"s{i}" for i in range(n)]
        rng.shuffle(order)
        splits = [order[w::count] for w in range(count)]
        for step in range(max(len(s) for s in splits)):
            trace += [(e, split[step]) for split in splits if step < len(split)]
    return trace


def two_jobs(n: int, epochs: int, rng: random.Random) -> Trace:
    """Job A reads two shards for each of job B's; B's epoch spans two of A's."""
    fast = reshuffled(n, epochs, rng)
    slow = reshuffled(n, epochs, rng)
    trace: Trace = []
    slow_iter = iter(slow)
    for index, (epoch, key) in enumerate(fast):
        trace.append((epoch, key))
        if index % 2:
            following = next(slow_iter, None)
            if following is not None:
                trace.append((epoch, following[1]))
    return trace


def node_of_four(n: int, epochs: int, rng: random.Random) -> Trace:
    trace: Trace = []
    for e in range(epochs):
        order = [f"s{i}" for i in range(n)]
        rng.shuffle(order)
        trace += [(e, key) for key in order[0::4]]
    return trace


TRACES: dict[str, Callable[[int, int, random.Random], Trace]] = {
    "sequential": sequential,
    "reshuffled": reshuffled,
    "8-workers": workers,
    "two-jobs": two_jobs,
    "node-of-4": node_of_four,
}


def _hit_ratio(hits: list[bool], trace: Trace) -> float:
    counted = [hit for hit, (epoch, _) in zip(hits, trace, strict=True) if epoch >= 1]
    return sum(counted) / len(counted) if counted else 0.0


def _least_recently_used(
    trace: Trace, capacity: int, admission: ScanResistantAdmission | None
) -> float:
    """LRU eviction; with `admission`, a miss whose victim it protects streams through."""
    cache: collections.OrderedDict[str, None] = collections.OrderedDict()
    hits = []
    for _, key in trace:
        hit = key in cache
        if admission is not None:
            admission.on_request(key, hit)
        hits.append(hit)
        if hit:
            cache.move_to_end(key)
            continue
        if len(cache) >= capacity:
            victim = next(iter(cache))
            if admission is not None and admission.is_protected(victim):
                continue  # streamed through, not admitted
            del cache[victim]
        cache[key] = None
    return _hit_ratio(hits, trace)


def lru(trace: Trace, capacity: int) -> float:
    return _least_recently_used(trace, capacity, None)


def scan_resistant(trace: Trace, capacity: int) -> float:
    return _least_recently_used(trace, capacity, ScanResistantAdmission())


def belady(trace: Trace, capacity: int) -> float:
    """The offline optimum for equal sizes with bypass: on a miss with a full cache, admit the
    new shard only if its next use comes before the furthest next use among the residents."""
    never = len(trace)
    next_use = [never] * len(trace)
    seen: dict[str, int] = {}
    for index in range(len(trace) - 1, -1, -1):
        key = trace[index][1]
        next_use[index] = seen.get(key, never)
        seen[key] = index
    resident: dict[str, int] = {}  # key -> its next use
    furthest: list[tuple[int, str]] = []  # max-heap by next use (negated), lazily cleaned
    hits = []
    for index, (_, key) in enumerate(trace):
        hit = key in resident
        hits.append(hit)
        upcoming = next_use[index]
        if not hit and len(resident) >= capacity:
            while furthest and resident.get(furthest[0][1]) != -furthest[0][0]:
                heapq.heappop(furthest)
            victim_use, victim = -furthest[0][0], furthest[0][1]
            if upcoming >= victim_use:
                continue  # bypass: the new shard is needed later than every resident
            heapq.heappop(furthest)
            del resident[victim]
        resident[key] = upcoming
        heapq.heappush(furthest, (-upcoming, key))
    return _hit_ratio(hits, trace)


POLICIES: dict[str, Callable[[Trace, int], float]] = {
    "lru": lru,
    "scan-resistant": scan_resistant,
    "belady": belady,
}


def dataset_switch(n: int, epochs: int, rng: random.Random, before: int = 3) -> Trace:
    """`before` reshuffled epochs of dataset A, then dataset B (other keys) for the rest."""
    trace: Trace = []
    for e in range(epochs):
        prefix = "a" if e < before else "b"
        order = [f"{prefix}{i}" for i in range(n)]
        rng.shuffle(order)
        trace += [(e, key) for key in order]
    return trace


def hits_per_epoch(trace: Trace, capacity: int) -> list[float]:
    """Scan-resistant admission's hit ratio in each epoch of `trace`."""
    admission = ScanResistantAdmission()
    cache: collections.OrderedDict[str, None] = collections.OrderedDict()
    hits: collections.Counter[int] = collections.Counter()
    reads: collections.Counter[int] = collections.Counter()
    for epoch, key in trace:
        hit = key in cache
        admission.on_request(key, hit)
        reads[epoch] += 1
        if hit:
            hits[epoch] += 1
            cache.move_to_end(key)
            continue
        if len(cache) >= capacity:
            victim = next(iter(cache))
            if admission.is_protected(victim):
                continue
            del cache[victim]
        cache[key] = None
    return [hits[e] / reads[e] for e in sorted(reads)]


def switch_table(shards: int, fractions: list[float], seed: int) -> Iterator[str]:
    before, after = 3, 5
    yield "| cache / dataset | A: passes 1-3 | B: passes 1-5 |"
    yield "|---|---|---|"
    for fraction in fractions:
        trace = dataset_switch(shards, before + after, random.Random(seed), before)
        ratios = hits_per_epoch(trace, max(1, round(fraction * shards)))
        a = " ".join(f"{r:.2f}" for r in ratios[:before])
        b = " ".join(f"{r:.2f}" for r in ratios[before:])
        yield f"| {fraction:.0%} | {a} | {b} |"


def decisions_per_second(entries: int = 100_000) -> tuple[float, float]:
    """Admission's cost at `entries` keys: requests recorded and eviction decisions per second."""
    admission = ScanResistantAdmission()
    keys = [f"http://origin.example/bucket/shards_{i:06d}.tar" for i in range(entries)]
    for key in keys:
        admission.on_request(key, False)
    random.Random(1).shuffle(keys)
    started = time.perf_counter()
    for key in keys:
        admission.on_request(key, True)
    recorded = entries / (time.perf_counter() - started)
    started = time.perf_counter()
    for key in keys:
        admission.is_protected(key)
    return recorded, entries / (time.perf_counter() - started)


def table(shards: int, epochs: int, fractions: list[float], seed: int) -> Iterator[str]:
    yield "| trace | cache / dataset | " + " | ".join(POLICIES) + " |"
    yield "|---|---|" + "---|" * len(POLICIES)
    for name, make in TRACES.items():
        trace = make(shards, epochs, random.Random(seed))
        distinct = len({key for _, key in trace if _ >= 0})
        for fraction in fractions:
            capacity = max(1, round(fraction * (distinct if name != "node-of-4" else shards)))
            ratios = [policy(trace, capacity) for policy in POLICIES.values()]
            yield f"| {name} | {fraction:.0%} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5, 0.75, 0.9])
    parser.add_argument(
        "--switch",
        action="store_true",
        help="per-pass hit ratios when the workload moves from dataset A to dataset B",
    )
    parser.add_argument(
        "--decisions",
        action="store_true",
        help="admission's requests recorded and decisions per second at 100k entries",
    )
    args = parser.parse_args()
    if args.decisions:
        recorded, decided = decisions_per_second()
        print(f"100k entries: {recorded:,.0f} requests recorded/s, {decided:,.0f} decisions/s")
        return
    lines = (
        switch_table(args.shards, args.fractions, args.seed)
        if args.switch
        else table(args.shards, args.epochs, args.fractions, args.seed)
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
