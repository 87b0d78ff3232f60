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
(`shardcache.cache.admission`: spare recently read entries, stream the new fill through instead),
`plan` (`shardcache.cache.plans`: each job, or each worker, posts its order for this epoch and
the next four at the start of each epoch, as `prefetch_ahead` does where the pipeline's order is
computable; eviction and admission follow the plans, scan-resistant admission for what no plan
reads), `plan (this epoch)` (the same posting only the current epoch: a pipeline whose later
order is not computable, or the stage before it planned further), `belady` (the offline optimum
with bypass: admit only when the new shard is needed again before the resident needed furthest
away), and `belady (horizon)`, the same knowing only what a plan can know: the current epoch and
the next four.
Shards are the same size, the cache holds C of them. The hit ratio counts epochs 2 onwards.
The shardcache policies are the store's own objects (`shardcache.cache.eviction`), told each
read, commit and eviction as the store tells them (`replay`).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardcache.cache.admission import ScanResistantAdmission  # noqa: E402
from shardcache.cache.eviction import (  # noqa: E402
    EvictionPolicy,
    LeastRecentlyUsed,
    PlanAware,
    ScanResistant,
)
from shardcache.cache.plans import PlanBook  # noqa: E402
from shardcache.errors import NotAdmitted  # noqa: E402
from shardcache.loader.webdataset import PLAN_EPOCHS_AHEAD  # noqa: E402

LRU_CANDIDATES = 64  # as the store's batch: eviction looks at this many LRU entries at a time


class Read(NamedTuple):
    epoch: int
    key: str
    job: int = 0  # the job (or worker) that reads it: each posts its own plan


Trace = list[Read]


def sequential(n: int, epochs: int, rng: random.Random) -> Trace:
    return [Read(e, f"s{i}") for e in range(epochs) for i in range(n)]


def reshuffled(n: int, epochs: int, rng: random.Random) -> Trace:
    trace: Trace = []
    for e in range(epochs):
        order = [f"s{i}" for i in range(n)]
        rng.shuffle(order)
        trace += [Read(e, key) for key in order]
    return trace


def workers(n: int, epochs: int, rng: random.Random, count: int = 8) -> Trace:
    trace: Trace = []
    for e in range(epochs):
        order = [f"s{i}" for i in range(n)]
        rng.shuffle(order)
        split = [order[w::count] for w in range(count)]
        for step in range(max(len(s) for s in split)):
            trace += [Read(e, split[w][step], w) for w in range(count) if step < len(split[w])]
    return trace


def two_jobs(n: int, epochs: int, rng: random.Random) -> Trace:
    """Job A reads two shards for each of job B's; B's epoch spans two of A's."""
    fast = reshuffled(n, epochs, rng)
    slow = reshuffled(n, epochs, rng)
    trace: Trace = []
    slow_iter = iter(slow)
    for index, read in enumerate(fast):
        trace.append(read)
        if index % 2:
            following = next(slow_iter, None)
            if following is not None:
                trace.append(Read(following.epoch, following.key, 1))
    return trace


def node_of_four(n: int, epochs: int, rng: random.Random) -> Trace:
    trace: Trace = []
    for e in range(epochs):
        order = [f"s{i}" for i in range(n)]
        rng.shuffle(order)
        trace += [Read(e, key) for key in order[0::4]]
    return trace


TRACES: dict[str, Callable[[int, int, random.Random], Trace]] = {
    "sequential": sequential,
    "reshuffled": reshuffled,
    "8-workers": workers,
    "two-jobs": two_jobs,
    "node-of-4": node_of_four,
}


def _hit_ratio(hits: list[bool], trace: Trace) -> float:
    counted = [hit for hit, read in zip(hits, trace, strict=True) if read.epoch >= 1]
    return sum(counted) / len(counted) if counted else 0.0


def _nothing(key: str) -> bool:
    return False


def _no_posts(index: int, read: Read) -> None:
    pass


def replay(
    trace: Trace,
    capacity: int,
    policy: EvictionPolicy,
    before_read: Callable[[int, Read], None] = _no_posts,
) -> list[bool]:
    """Whether each read of `trace` hits, through `policy` over a cache of `capacity` shards,
    told what the store tells it: each request, each commit, each eviction; a miss whose
    victim the policy keeps (NotAdmitted) streams through. `before_read(index, read)` runs
    first (a loader posting its plans, the clock moving)."""
    cache: collections.OrderedDict[str, None] = collections.OrderedDict()
    hits = []
    for index, read in enumerate(trace):
        before_read(index, read)
        key = read.key
        hit = key in cache
        policy.on_request(key, hit)
        hits.append(hit)
        if hit:
            cache.move_to_end(key)
            continue
        if len(cache) >= capacity:
            candidates = list(itertools.islice(cache, LRU_CANDIDATES))
            try:
                victim = policy.choose(candidates, key, True, _nothing)
            except NotAdmitted:
                continue  # streamed through, not admitted
            if victim is None:
                continue
            del cache[victim]
            policy.on_evict(victim)
        cache[key] = None
        policy.on_commit(key)
    return hits


def lru(trace: Trace, capacity: int) -> float:
    return _hit_ratio(replay(trace, capacity, LeastRecentlyUsed()), trace)


def scan_resistant(trace: Trace, capacity: int) -> float:
    policy = ScanResistant(ScanResistantAdmission())
    return _hit_ratio(replay(trace, capacity, policy), trace)


def belady(trace: Trace, capacity: int) -> float:
    """The offline optimum for equal sizes with bypass: on a miss with a full cache, admit the
    new shard only if its next use comes before the furthest next use among the residents."""
    never = len(trace)
    next_use = [never] * len(trace)
    seen: dict[str, int] = {}
    for index in range(len(trace) - 1, -1, -1):
        key = trace[index].key
        next_use[index] = seen.get(key, never)
        seen[key] = index
    resident: dict[str, int] = {}  # key -> its next use
    furthest: list[tuple[int, str]] = []  # max-heap by next use (negated), lazily cleaned
    hits = []
    for index, (_, key, _) in enumerate(trace):
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


def planned(trace: Trace, capacity: int, epochs_ahead: int = PLAN_EPOCHS_AHEAD) -> float:
    """Plans through `shardcache.cache.plans`: each job posts, as it starts an epoch, its order for
    that epoch and the next `epochs_ahead`; the clock is the request count (each job's pace is
    learned)."""
    orders: dict[tuple[int, int], list[str]] = {}
    for read in trace:
        orders.setdefault((read.job, read.epoch), []).append(read.key)
    now = [0.0]
    plans = PlanBook(quiet_after_s=float("inf"), clock=lambda: now[0])
    posted: set[tuple[int, int]] = set()

    def post(index: int, read: Read) -> None:
        now[0] = float(index)
        if (read.job, read.epoch) not in posted:
            posted.add((read.job, read.epoch))
            keys = [
                key
                for ahead in range(epochs_ahead + 1)
                for key in orders.get((read.job, read.epoch + ahead), [])
            ]
            plans.post(str(read.job), read.epoch, keys)

    policy = PlanAware(plans, ScanResistant(ScanResistantAdmission()))
    return _hit_ratio(replay(trace, capacity, policy, post), trace)


def planned_this_epoch(trace: Trace, capacity: int) -> float:
    """Plans of the current epoch only: what a pipeline whose later order is unknown posts."""
    return planned(trace, capacity, 0)


def belady_horizon(trace: Trace, capacity: int) -> float:
    """Belady knowing what plans can know: a next use counts only within the reader's current
    epoch and the next PLAN_EPOCHS_AHEAD; beyond that every shard looks alike (never needed)."""
    never = len(trace)
    next_use = [never] * len(trace)
    seen: dict[str, int] = {}
    for index in range(len(trace) - 1, -1, -1):
        next_use[index] = seen.get(trace[index].key, never)
        seen[trace[index].key] = index

    def known(use: int, epoch: int) -> int:
        return use if use < never and trace[use].epoch <= epoch + PLAN_EPOCHS_AHEAD else never

    resident: dict[str, int] = {}  # key -> its next use
    hits = []
    for index, (epoch, key, _) in enumerate(trace):
        hit = key in resident
        hits.append(hit)
        if not hit and len(resident) >= capacity:
            victim = max(resident, key=lambda k: known(resident[k], epoch))
            if known(next_use[index], epoch) >= known(resident[victim], epoch):
                continue
            del resident[victim]
        resident[key] = next_use[index]
    return _hit_ratio(hits, trace)


POLICIES: dict[str, Callable[[Trace, int], float]] = {
    "lru": lru,
    "scan-resistant": scan_resistant,
    "plan (this epoch)": planned_this_epoch,
    "plan": planned,
    "belady (horizon)": belady_horizon,
    "belady": belady,
}


def dataset_switch(n: int, epochs: int, rng: random.Random, before: int = 3) -> Trace:
    """`before` reshuffled epochs of dataset A, then dataset B (other keys) for the rest."""
    trace: Trace = []
    for e in range(epochs):
        prefix = "a" if e < before else "b"
        order = [f"{prefix}{i}" for i in range(n)]
        rng.shuffle(order)
        trace += [Read(e, key) for key in order]
    return trace


def hits_per_epoch(trace: Trace, capacity: int) -> list[float]:
    """Scan-resistant admission's hit ratio in each epoch of `trace`."""
    hit_list = replay(trace, capacity, ScanResistant(ScanResistantAdmission()))
    hits: collections.Counter[int] = collections.Counter()
    reads: collections.Counter[int] = collections.Counter()
    for hit, read in zip(hit_list, trace, strict=True):
        reads[read.epoch] += 1
        hits[read.epoch] += hit
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


def decisions_per_second(entries: int = 100_000) -> dict[str, float]:
    """The policies' cost at `entries` cached keys, per second: requests recorded and eviction
    decisions by scan-resistant admission, and by plans (one plan over every key, all cached,
    each decision followed by the eviction it chose, as the store does)."""
    keys = [f"http://origin.example/bucket/shards_{i:06d}.tar" for i in range(entries)]
    admission = ScanResistantAdmission()
    for key in keys:
        admission.on_request(key, False)
    order = keys[:]
    random.Random(1).shuffle(order)
    rates: dict[str, float] = {}
    started = time.perf_counter()
    for key in order:
        admission.on_request(key, True)
    rates["admission: requests recorded"] = entries / (time.perf_counter() - started)
    started = time.perf_counter()
    for key in order:
        admission.is_protected(key)
    rates["admission: decisions"] = entries / (time.perf_counter() - started)
    plans = PlanBook(quiet_after_s=float("inf"))
    plans.post("job", 0, order)
    for key in keys:
        plans.on_cached(key)
    started = time.perf_counter()
    for key in order[: entries // 2]:
        plans.on_request(key, True)
    rates["plans: requests recorded"] = entries / 2 / (time.perf_counter() - started)
    policy = PlanAware(plans, ScanResistant(admission))
    lru_batch = keys[:LRU_CANDIDATES]
    decisions = entries // 10
    started = time.perf_counter()
    for key in order[entries // 2 : entries // 2 + decisions]:
        victim = policy.choose(lru_batch, key, False, _nothing)
        if victim is not None:
            policy.on_evict(victim)
    rates["plans: decisions"] = decisions / (time.perf_counter() - started)
    return rates


def table(shards: int, epochs: int, fractions: list[float], seed: int) -> Iterator[str]:
    yield "| trace | cache / dataset | " + " | ".join(POLICIES) + " |"
    yield "|---|---|" + "---|" * len(POLICIES)
    for name, make in TRACES.items():
        trace = make(shards, epochs, random.Random(seed))
        distinct = len({read.key for read in trace})
        for fraction in fractions:
            capacity = max(1, round(fraction * (distinct if name != "node-of-4" else shards)))
            ratios = [policy(trace, capacity) for policy in POLICIES.values()]
            yield f"| {name} | {fraction:.0%} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=400, help="dataset size, in shards")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per trace")
    parser.add_argument("--seed", type=int, default=1, help="of the shuffles")
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[0.1, 0.25, 0.5, 0.75, 0.9],
        help="cache sizes, as fractions of the dataset",
    )
    parser.add_argument(
        "--switch",
        action="store_true",
        help="per-pass hit ratios when the workload moves from dataset A to dataset B",
    )
    parser.add_argument(
        "--decisions",
        action="store_true",
        help="requests recorded and eviction decisions per second at 100k entries, by policy",
    )
    args = parser.parse_args()
    if args.decisions:
        for what, rate in decisions_per_second().items():
            print(f"100k entries, {what}: {rate:,.0f}/s")
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
