"""The README's WebDataset pipeline run as a data-parallel job (issue 35): 2 and 4 nodes, each node
its own daemon, two loader workers a node, three epochs, one origin that counts what each node
asks of it and when (`tests/data_parallel_nodes.py` runs it).

torch is not installed (its wheels are gigabytes of CUDA), so each `DataLoader` worker is a
process iterating the pipeline itself, with RANK/WORLD_SIZE and WORKER/NUM_WORKERS in its
environment: the variables `webdataset.utils.pytorch_worker_info` reads without torch.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

from tests.data_parallel_nodes import Node, Setup, run, windows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from trace_sim import Read, belady  # noqa: E402

PER_NODE = 24  # shards each node reads an epoch (12 a worker)
CACHE_SHARDS = 8  # a third of a node's share: eviction decides what the next epoch finds
KEPT_OF_OPTIMUM = 0.6  # of the optimum's, mean over nodes: see the test's docstring


def _strays_and_stale(node: Node, epochs: set[int], shards: set[str]) -> tuple[set[str], set[str]]:
    """Of `shards` (fetched or pinned while the node was in one of `epochs`): the strays, which
    the node reads neither in that epoch nor the next (another node's), and the stale ones,
    which it read in an earlier epoch (a look-ahead the read overtook, fetched again after it)."""
    current = {s for e in epochs for order in node.orders[max(e, 0) : e + 2] for s in order}
    earlier = {s for order in node.orders[: max(epochs)] for s in order}
    return shards - current - earlier, (shards - current) & earlier


def _budget_problems(node: Node, workers: int) -> list[str]:
    """While every worker of the node reads: stray pins, and look-ahead waiting on budget held
    by nobody (no holder and no prefetch running, three samples in a row: a wait also begins
    while the items before it are sized) or by something no job of this node asked for."""
    problems = []
    held_by_nobody = 0
    for epochs, sample in windows(node.samples):
        if len(sample.alive) < workers:  # a job that ended: its pins end once it is silent
            continue
        strays, _ = _strays_and_stale(node, epochs, set(sample.pinned))
        problems += [f"{shard} pinned in epoch {max(epochs) + 1}" for shard in strays]
        is_waiting = sample.waiting_for is not None
        held_by_nobody = held_by_nobody + 1 if is_waiting and not sample.held_by else 0
        if held_by_nobody >= 3 and not sample.in_flight or "other" in sample.held_by:
            problems.append(f"waiting on budget held by nobody: {sample}")
    return problems


def _kept_and_optimum(node: Node) -> tuple[float, float]:
    """The share of this node's epoch 2-3 reads whose shard stayed cached since the node last
    read it (no origin GET in between: a prefetch counts as one), and the offline optimum's
    (`trace_sim.belady`, equal sizes, bypass) for the same reads at the same cache size."""
    trace = [Read(epoch, shard) for epoch, shard in node.trace()]
    later = [
        fetched for fetched, read in zip(node.fetched_reads(), trace, strict=True) if read.epoch
    ]
    return 1 - sum(later) / len(later), belady(trace, CACHE_SHARDS)


@pytest.mark.parametrize("nodes", [2, 4])
def test_the_readme_pipeline_over_three_epochs_fetches_each_nodes_share_only(
    nodes: int, start_daemon, tmp_path: Path
) -> None:
    """Each node reads its share (`wds.detshuffle(1000, seed=0)` then `split_by_node`: a new
    share each epoch) through its own daemon with default settings (`--readahead 2`), a cache
    of a third of its share and `prefetch_ahead(2)`; epochs end together on every node.

    Every sample is read once an epoch across the nodes; a node asks the origin only for its
    own shards (this epoch's, the next's, or ones it read before: a look-ahead its read
    overtook, fetched again, printed); every shard of its first share once at least; no stray
    pin, and no wait on budget held by nobody while its workers read. Epochs 2-3: the reads
    whose shard stayed cached since the node last read it, against the offline optimum for
    the same reads and cache (`trace_sim.belady`, which ignores the room look-ahead takes),
    mean over nodes. Measured on the shared 2-core VM (load average 5-14): 69-83% a node,
    75-82% the mean after the queue's fixes (3f4f3ad); 56-86% and 62-80% before them (nine
    runs); 25-50% a node, 33-44% the mean before `prefetch_ahead` planned the next epochs
    (194c4d0, where this test failed). The bar, 60%, sits between. The daemon's own figure
    stays short of the simulation's 95%: look-ahead holds room the optimum does not."""
    setup = Setup(nodes=nodes, shards=PER_NODE * nodes, cache_shards=CACHE_SHARDS)
    ran = run(setup, tmp_path, start_daemon)

    every_key = collections.Counter(key for node in ran for key in node.keys[0])
    assert len(every_key) == setup.shards * setup.samples_per_shard
    for epoch in range(setup.epochs):
        reads = collections.Counter(key for node in ran for key in node.keys[epoch])
        assert reads == collections.Counter(every_key.keys()), f"epoch {epoch + 1}: {reads}"

    ratios = []
    for node in ran:
        kept, optimum = _kept_and_optimum(node)
        ratios.append(kept / optimum)
        stale: set[str] = set()
        for epoch in range(setup.epochs):
            assert sorted(node.orders[epoch]) == sorted(s for _, s in node.reads[epoch])
            start = node.epoch_ends[epoch - 1] if epoch else 0.0
            span = {s for at, s in node.gets if start <= at < node.epoch_ends[epoch]}
            strays, old = _strays_and_stale(node, {epoch}, span)
            assert not strays, f"node {node.rank}, epoch {epoch + 1}: fetched {strays}"
            stale |= old
        print(
            f"node {node.rank}: from the origin (MiB) "
            + ", ".join(f"{node.origin_bytes(e) / 2**20:.2f}" for e in range(setup.epochs))
            + f" for shares of {node.share_bytes(0) / 2**20:.2f}; loader wait (s) "
            + ", ".join(f"{wait:.2f}" for wait in node.wait_s)
            + f"; epochs 2-3 kept {kept:.3f} of reads, the optimum {optimum:.3f}"
            + f" ({kept / optimum:.0%}); fetched and never read {len(node.unread_gets())}"
            + f" (stale: {sorted(stale)}); answers {[dict(r) for r in node.results()]}"
        )
        first = collections.Counter(s for at, s in node.gets if at < node.epoch_ends[0])
        assert set(first) >= set(node.orders[0])
        problems = _budget_problems(node, setup.workers)
        assert not problems, problems
        assert "bound" not in node.samples[-1].pins_ended, node.samples[-1].pins_ended
    print(f"kept / optimum, mean over nodes: {sum(ratios) / len(ratios):.0%}")
    assert sum(ratios) / len(ratios) >= KEPT_OF_OPTIMUM
