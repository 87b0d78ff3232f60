"""The next epochs' order of a real WebDataset pipeline, replayed (`loader.pipeline_order`):
what the forecast says equals what the pipeline then hands on, for every node and worker."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import webdataset as wds

from shardcache.loader import pipeline_order
from shardcache.loader.webdataset import PLAN_EPOCHS_AHEAD, prefetch_ahead

URLS = [f"http://127.0.0.1:9/lake/shards_{n:03d}.tar" for n in range(40)]
Shard = dict[str, Any]


class Recorder:
    """A pipeline stage placed where `prefetch_ahead` goes: it keeps the forecast made from the
    calling pipeline at each epoch's start, and hands the shards on."""

    def __init__(self) -> None:
        self.forecasts: list[list[list[str]]] = []
        self.failure: str | None = None

    def __call__(self, shards: Iterable[Shard]) -> Iterator[Shard]:
        import sys

        found = pipeline_order.calling_pipeline(sys._getframe(1), self)
        assert found is not None
        pipeline, index = found
        try:
            forecast = pipeline_order.forecast(pipeline.pipeline[:index])  # type: ignore[attr-defined]
        except pipeline_order.Unpredictable as exc:
            self.failure = str(exc)
        else:
            self.forecasts.append([[s["url"] for s in forecast.order(ahead)] for ahead in (1, 2)])
        return iter(shards)


def _place(
    monkeypatch: pytest.MonkeyPatch, rank: int, world: int, worker: int, workers: int
) -> None:
    for name, value in (("RANK", rank), ("WORLD_SIZE", world), ("WORKER", worker),
                        ("NUM_WORKERS", workers)):  # fmt: skip
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 1), (4, 2), (3, 4)])
def test_the_forecast_is_what_the_pipeline_hands_on_in_the_next_epochs(
    monkeypatch: pytest.MonkeyPatch, world: int, workers: int
) -> None:
    for rank in range(world):
        for worker in range(workers):
            _place(monkeypatch, rank, world, worker, workers)
            recorder = Recorder()
            pipeline = wds.DataPipeline(
                wds.SimpleShardList(URLS),
                wds.detshuffle(100, seed=7),
                wds.split_by_node,
                wds.split_by_worker,
                recorder,
            )
            epochs = [[shard["url"] for shard in pipeline] for _ in range(4)]
            assert recorder.failure is None
            for epoch in range(2):
                assert recorder.forecasts[epoch] == [epochs[epoch + 1], epochs[epoch + 2]]
            assert epochs[0] != epochs[1]  # reshuffled: a forecast that repeats would fail


def test_a_stage_that_cannot_be_replayed_is_named() -> None:
    for stages, named in (
        ([wds.shuffle(100), wds.split_by_node], "shuffle"),
        ([wds.split_by_node, wds.map(lambda shard: shard)], "map"),
    ):
        recorder = Recorder()
        list(wds.DataPipeline(wds.SimpleShardList(URLS), *stages, recorder))
        assert recorder.failure is not None and named in recorder.failure, recorder.failure
    recorder = Recorder()
    list(zip(range(5), wds.DataPipeline(wds.ResampledShards(URLS), recorder), strict=False))
    assert recorder.failure is not None and "not a fixed list" in recorder.failure


def test_called_outside_a_pipeline_there_is_no_pipeline() -> None:
    import sys

    assert pipeline_order.calling_pipeline(sys._getframe(0), object()) is None


@pytest.mark.parametrize(
    ("world", "stages", "advice"),
    [
        (2, [wds.shuffle(100), wds.split_by_node], "wds.detshuffle(seed=...)"),
        (2, [wds.split_by_worker], "every node reads every shard"),
        (2, [wds.detshuffle(100, seed=1), wds.split_by_node], None),
        (1, [wds.shuffle(100), wds.split_by_node], None),
    ],
)
def test_nodes_that_would_read_overlapping_shares_are_named(
    monkeypatch: pytest.MonkeyPatch, world: int, stages: list[object], advice: str | None
) -> None:
    _place(monkeypatch, 0, world, 0, 1)
    risk = pipeline_order.nodes_risk([wds.SimpleShardList(URLS), *stages])
    assert (risk is None) if advice is None else (risk is not None and advice in risk), risk


def test_a_clock_seeded_shard_list_is_an_overlap_risk(monkeypatch: pytest.MonkeyPatch) -> None:
    _place(monkeypatch, 0, 2, 0, 1)
    risk = pipeline_order.nodes_risk([wds.SimpleShardList(URLS, seed=True), wds.split_by_node])
    assert risk is not None and "seed=True" in risk


def test_prefetch_ahead_says_once_why_it_plans_one_epoch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No daemon listens on the URLs' port: the stage says that once too, and reads on."""
    _place(monkeypatch, 0, 2, 0, 1)
    monkeypatch.setattr("shardcache.loader.webdataset._said", set())
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(URLS), wds.shuffle(100), wds.split_by_node, prefetch_ahead(2)
    )
    with caplog.at_level(logging.WARNING, logger="shardcache.webdataset"):
        assert [len(list(pipeline)) for _ in range(2)] == [20, 20]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("overlapping shares" in line for line in lines) == 1, lines
    assert sum("plans name this epoch only" in line for line in lines) == 1, lines
    assert PLAN_EPOCHS_AHEAD >= 4  # what the simulation needs to reach 95% of the optimum


@pytest.mark.parametrize(
    ("stages", "after", "advice"),
    [
        ([], [], "no split_by_worker before prefetch_ahead"),
        ([], [wds.split_by_worker], "split_by_worker comes after prefetch_ahead"),
        ([wds.split_by_worker], [], None),
    ],
)
def test_workers_that_would_read_or_plan_one_share_are_named(
    monkeypatch: pytest.MonkeyPatch, stages: list[object], after: list[object], advice: str | None
) -> None:
    _place(monkeypatch, 0, 1, 0, 2)
    risk = pipeline_order.workers_risk([wds.SimpleShardList(URLS), *stages], after)
    assert (risk is None) if advice is None else (risk is not None and advice in risk), risk


def test_the_stage_placed_after_the_samples_says_where_it_goes() -> None:
    """`wds.WebDataset(...).compose(prefetch_ahead(4))` hands it samples, not shards."""
    stage = prefetch_ahead(2, daemon="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="place it before tarfile_to_samples"):
        list(stage(iter([{"__key__": "a", "jpg": b""}])))
