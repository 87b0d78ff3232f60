"""Scan-resistant admission in simulation.

The traces and policies are `benchmarks/trace_sim.py`'s, the policy is `cache.admission`'s.
What the issue asks of the default policy without a plan: single-job sequential and reshuffled
epochs at C/N within 0.03 from epoch 2, and never below LRU by more than 0.02."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import trace_sim  # noqa: E402

from shardcache.cache.admission import ScanResistantAdmission  # noqa: E402

SHARDS = 200


@pytest.mark.parametrize("name", ["sequential", "reshuffled", "8-workers"])
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_one_job_keeps_its_share_of_the_dataset(name: str, fraction: float) -> None:
    trace = trace_sim.TRACES[name](SHARDS, 5, random.Random(3))
    capacity = int(fraction * SHARDS)
    assert trace_sim.belady(trace, capacity) == pytest.approx(fraction, abs=0.01)
    assert trace_sim.scan_resistant(trace, capacity) == pytest.approx(fraction, abs=0.03)
    assert trace_sim.lru(trace, capacity) < fraction - 0.1  # what LRU loses here


@pytest.mark.parametrize("name", list(trace_sim.TRACES))
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_never_below_lru(name: str, fraction: float) -> None:
    trace = trace_sim.TRACES[name](SHARDS, 5, random.Random(4))
    capacity = int(fraction * SHARDS)
    scan_resistant = trace_sim.scan_resistant(trace, capacity)
    assert scan_resistant >= trace_sim.lru(trace, capacity) - 0.02
    assert scan_resistant <= trace_sim.belady(trace, capacity) + 1e-9


def test_a_new_dataset_is_cached_again_within_two_passes() -> None:
    """Three epochs of dataset A, then B at a half-size cache: B's share is admitted during
    its second pass, so its third pass hits C/N (per-entry ageing alone took five)."""
    trace = trace_sim.dataset_switch(SHARDS, 7, random.Random(2), before=3)
    ratios = trace_sim.hits_per_epoch(trace, SHARDS // 2)
    assert ratios[1] == pytest.approx(0.5, abs=0.03)  # A is kept while it is read
    assert ratios[3] == ratios[4] == 0  # B's first two passes: nothing of B cached yet
    assert ratios[5] == pytest.approx(0.5, abs=0.03)
    assert ratios[6] == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.75])
def test_a_new_dataset_is_cached_again_at_other_sizes(fraction: float) -> None:
    trace = trace_sim.dataset_switch(SHARDS, 7, random.Random(5), before=3)
    ratios = trace_sim.hits_per_epoch(trace, int(fraction * SHARDS))
    assert ratios[-1] == pytest.approx(fraction, abs=0.03)
    assert ratios[5] >= fraction - 0.05 - (0.1 if fraction > 0.5 else 0)


def test_nothing_is_protected_once_the_cache_stops_serving() -> None:
    """A resident set that served hits and then none for a typical re-reference distance (and
    16 hit spacings) is stale for good; what is read again is not."""
    admission = ScanResistantAdmission()
    for _ in range(10):
        for i in range(10):
            admission.on_request(f"k{i}", hit=i < 5)
    assert admission.is_protected("k0")
    for i in range(15):
        admission.on_request(f"new{i}", hit=False)
    assert admission.is_serving()  # 15 requests: less than 16 hit spacings of 2
    for i in range(30):
        admission.on_request(f"new{i}", hit=False)
    assert not admission.is_serving()
    assert not admission.is_protected("k0")
    admission.on_request("k1", hit=True)
    assert admission.is_serving()
    assert admission.is_protected("k1")
    assert not admission.is_protected("k0")  # stale until it is read again
