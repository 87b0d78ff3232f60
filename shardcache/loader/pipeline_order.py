"""The order a WebDataset pipeline's shard stages will hand on in later epochs, replayed, so plans
can reach past this epoch's end.

Only stages known to depend on nothing but input, epoch and worker are replayed (`detshuffle`,
`split_by_node`, `split_by_worker`, ...); anything else plans the current epoch only, said once.
Stdlib only: WebDataset's classes are recognised by module and name, never imported."""

from __future__ import annotations

import copy
import functools
import os
import sys
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

Shard = dict[str, Any]

# The shard-list functions WebDataset defines in `webdataset.shardlists`, by name.
_SPLITTERS = {"split_by_node", "split_by_worker", "single_node_only"}


class Unpredictable(Exception):
    """The pipeline's later order cannot be computed; the message says which stage and why."""


def _is_webdataset(thing: object, *names: str) -> bool:
    """Whether `thing` is an instance of one of WebDataset's classes `names` (or a subclass)."""
    return any(
        cls.__name__ in names and cls.__module__.split(".")[0] == "webdataset"
        for cls in type(thing).__mro__
    )


def _is_replayable(thing: object, name: str, *members: str) -> bool:
    """Whether `thing` is WebDataset's class `name` itself, or a subclass that keeps its
    `members`: a subclass that draws its order otherwise (its own `run`, `__iter__` or `epoch`
    property) may read its epoch elsewhere or keep state that a replay would move on."""
    cls = type(thing)
    return _is_webdataset(thing, name) and not any(
        member in vars(klass) for klass in cls.__mro__[: _depth_of(cls, name)] for member in members
    )


def _depth_of(cls: type, name: str) -> int:
    """The place of WebDataset's class `name` in `cls`'s method resolution order."""
    for depth, klass in enumerate(cls.__mro__):
        if klass.__name__ == name and klass.__module__.split(".")[0] == "webdataset":
            return depth
    return len(cls.__mro__)


def _attribute(thing: object, name: str) -> Any:
    """`thing.name`, or None: a stage may answer attribute access with any error (a dict whose
    `__getattr__` is `__getitem__` raises KeyError), and advice must never fail an epoch."""
    try:
        return getattr(thing, name, None)
    except Exception:
        return None


def _is_splitter(step: object) -> bool:
    return (
        callable(step)
        and _attribute(step, "__module__") == "webdataset.shardlists"
        and _attribute(step, "__name__") in _SPLITTERS
    )


def describe(step: object) -> str:
    """A stage as the user wrote it, near enough: `wds.shuffle`, `my_filter`, `ResampledShards`."""
    inner = _attribute(step, "f")  # WebDataset's curried filters keep the function as `f`
    function = inner if callable(inner) else step
    name = _attribute(function, "__name__")
    return (name if isinstance(name, str) and name else type(step).__name__).lstrip("_")


@dataclass(frozen=True)
class OrderForecast:
    """The stages before `prefetch_ahead`, able to hand on a later epoch's shards again."""

    source: object
    stages: tuple[object, ...]

    def order(self, epochs_ahead: int) -> Iterator[Shard]:
        """This worker's shards, in order, `epochs_ahead` (1 or more) epochs after the current
        one, computed as they are taken (a plan takes the first few thousand of a million).
        Each `detshuffle` runs as a copy, its epoch moved on, so the pipeline's own state is
        untouched."""
        if epochs_ahead < 1:
            raise ValueError("epochs_ahead must be at least 1")
        shards: Iterable[Any] = iter(self.source)  # type: ignore[call-overload]
        for stage in self.stages:
            if _is_webdataset(stage, "detshuffle"):
                ahead = copy.copy(stage)
                ahead.epoch = stage.epoch + epochs_ahead - 1  # type: ignore[attr-defined]
                shards = ahead.run(shards)  # type: ignore[attr-defined]
            else:
                shards = stage(shards)  # type: ignore[operator]
        return (dict(shard) if isinstance(shard, dict) else {"url": shard} for shard in shards)

    @functools.cached_property
    def _source_signature(self) -> tuple[object, ...] | None:
        """The source's part of `signature`, once per forecast (a million URLs hashed: 0.15 s)."""
        if type(self.source) is list:
            return None
        urls, seed = _attribute(self.source, "urls"), _attribute(self.source, "seed")
        if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls[:1]):
            return None
        return (id(self.source), hash(tuple(urls)), seed)

    def signature(self, epochs_ahead: int) -> Hashable | None:
        """What the order `epochs_ahead` epochs on depends on, or None where it cannot be told
        cheaply (a plain list as the source): equal signatures, equal orders."""
        source = self._source_signature
        if source is None:
            return None
        parts: list[object] = [*source, _place()]
        for stage in self.stages:
            if _is_webdataset(stage, "detshuffle"):
                settings = (_attribute(stage, name) for name in ("seed", "bufsize", "initial"))
                parts.append((id(stage), *settings, stage.epoch + epochs_ahead))  # type: ignore[attr-defined]
            else:
                parts.append(id(stage))
        try:
            hash(tuple(parts))
        except TypeError:  # an unhashable seed
            return None
        return tuple(parts)


def calling_pipeline(frame: FrameType | None, stage: object) -> tuple[object, int] | None:
    """The WebDataset `DataPipeline` whose iteration called `stage`, and the stage's place in
    it: `DataPipeline.invoke(f, *args)` calls `f(*args)`, so the caller's frame holds the
    pipeline as `self`. None when called otherwise (by hand, by another framework)."""
    owner = frame.f_locals.get("self") if frame is not None else None
    if owner is None or not _is_webdataset(owner, "DataPipeline"):
        return None
    steps = getattr(owner, "pipeline", None)
    if not isinstance(steps, list):
        return None
    for index, step in enumerate(steps):
        if step is stage:
            return owner, index
    return None


def forecast(steps: list[object]) -> OrderForecast:
    """The forecast for a pipeline whose stages before `prefetch_ahead` are `steps`; raises
    Unpredictable naming the first stage that cannot be replayed."""
    if not steps:
        raise Unpredictable("prefetch_ahead is the pipeline's first stage")
    source, *stages = steps
    if not (_is_replayable(source, "SimpleShardList", "__iter__") or type(source) is list):
        raise Unpredictable(f"the shard source {describe(source)} is not a fixed list")
    for stage in stages:
        if _is_webdataset(stage, "detshuffle"):
            if not _is_replayable(stage, "detshuffle", "run", "epoch"):
                raise Unpredictable(f"{describe(stage)} draws its order its own way")
            if type(_attribute(stage, "epoch")) is not int:
                raise Unpredictable("detshuffle has no epoch number")
        elif not _is_splitter(stage):
            raise Unpredictable(f"stage {describe(stage)} is not one prefetch_ahead can replay")
    return OrderForecast(source, tuple(stages))


def nodes_risk(steps: list[object], after: list[object] | None = None) -> str | None:
    """What makes the nodes of a data-parallel job read overlapping shares, or None: with
    several nodes (WORLD_SIZE as WebDataset reads it), a stage before `split_by_node` that
    may order the shards differently on each node (WebDataset's `shuffle` seeds itself from
    the process id and the time), or no `split_by_node` at all. `after` are the stages after
    `prefetch_ahead`: a `split_by_node` there leaves each node planning and prefetching every
    shard, though it reads only its share."""
    world_size = _world_size()
    if world_size <= 1:
        return None
    splits = [index for index, step in enumerate(steps) if describe(step) == "split_by_node"]
    if not splits and any(describe(step) == "split_by_node" for step in after or []):
        return (
            "split_by_node comes after prefetch_ahead: each node plans and prefetches every "
            "shard, though it reads only its share; place prefetch_ahead after split_by_node "
            "and split_by_worker"
        )
    if not splits:
        return (
            f"WORLD_SIZE is {world_size} but no split_by_node comes before prefetch_ahead: "
            "every node reads every shard"
        )
    for step in steps[1 : splits[0]]:
        if not (_is_webdataset(step, "detshuffle") or _is_splitter(step)):
            return (
                f"stage {describe(step)} before split_by_node may order the shards differently "
                "on each node (wds.shuffle seeds itself per process): nodes then read "
                "overlapping shares, some shards twice and others never; use "
                "wds.detshuffle(seed=...) before split_by_node"
            )
    source_seed = _attribute(steps[0], "seed")
    if isinstance(source_seed, float):  # SimpleShardList(seed=True) takes the time
        return (
            "the shard list is shuffled with a seed from the clock (seed=True), different on "
            "each node: nodes then read overlapping shares; give every node the same seed"
        )
    return None


def workers_risk(steps: list[object], after: list[object] | None = None) -> str | None:
    """What makes a node's DataLoader workers read or plan overlapping shares, or None: with
    several workers (NUM_WORKERS, or torch's worker info, as WebDataset reads them) and no
    `split_by_worker` before `prefetch_ahead`."""
    try:
        workers = int(str(_place()[3]))
    except Exception:  # no advice rather than a crash
        return None
    if workers <= 1 or any(describe(step) == "split_by_worker" for step in steps):
        return None
    if any(describe(step) == "split_by_worker" for step in after or []):
        return (
            f"split_by_worker comes after prefetch_ahead: each of the {workers} workers plans "
            "and prefetches the node's whole share, though it reads only its own; place "
            "prefetch_ahead after split_by_worker"
        )
    return (
        f"{workers} DataLoader workers but no split_by_worker before prefetch_ahead: every "
        "worker reads the node's whole share (each sample once per worker); add "
        "wds.split_by_worker after split_by_node"
    )


def _world_size() -> int:
    """WORLD_SIZE as WebDataset's `pytorch_worker_info` finds it (the environment, else
    torch.distributed); 1 when there is none."""
    try:
        return int(str(_place()[1]))
    except Exception:  # a distributed backend in a bad state: no advice rather than a crash
        return 1


def _place() -> tuple[object, ...]:
    """(rank, world size, worker, workers) as WebDataset's `pytorch_worker_info` finds them,
    asked of the WebDataset already imported. Where torch is not imported, the environment
    alone, as WebDataset would find it, without WebDataset importing torch to learn what it
    already knows (a process that never used torch has no process group or DataLoader
    worker; the import costs seconds and hundreds of MB in a loader of another framework)."""
    info = getattr(sys.modules.get("webdataset.utils"), "pytorch_worker_info", None)
    if callable(info) and "torch" in sys.modules:
        return tuple(info())
    env = os.environ
    node = (env["RANK"], env["WORLD_SIZE"]) if {"RANK", "WORLD_SIZE"} <= env.keys() else (0, 1)
    worker = (
        (env["WORKER"], env["NUM_WORKERS"]) if {"WORKER", "NUM_WORKERS"} <= env.keys() else (0, 1)
    )
    return (*node, *worker)


def in_fresh_dataloader_worker(epochs_seen: int) -> bool:
    """Whether this is the first epoch of a torch DataLoader worker: with
    `persistent_workers=False` (torch's default) each epoch starts in a fresh copy of the
    pipeline, whose `detshuffle` starts again from its first epoch; the forecast of epoch 1 would
    then be wrong. Only a worker that lived through an epoch forecasts."""
    if epochs_seen > 0:
        return False
    torch_data = sys.modules.get("torch.utils.data")
    get_worker_info = getattr(torch_data, "get_worker_info", None)
    return callable(get_worker_info) and get_worker_info() is not None


def chained(
    forecast_: OrderForecast, epochs: int, known: dict[Hashable, list[Shard]] | None = None
) -> Iterator[Shard]:
    """The next `epochs` epochs' shards, one after the other, each computed when reached.

    With `known` (kept by the caller from one epoch to the next), an epoch's order computed
    whole an epoch earlier, when it was one epoch further ahead, is taken from there: each
    replay walks the whole shard list (a million shards split 512 ways: four replays held
    the epoch's first shard 6-13 s, against 1.7 s for the pipeline's own pass). `known` is
    left holding the orders of this call's epochs only."""
    remembered = dict(known or {})
    if known is not None:
        known.clear()
    for ahead in range(1, epochs + 1):
        signature = forecast_.signature(ahead) if known is not None else None
        order = remembered.get(signature) if signature is not None else None
        if order is not None:
            known[signature] = order  # type: ignore[index]
            yield from order
            continue
        taken: list[Shard] = []  # at most what the plan takes: the iteration stops there
        for shard in forecast_.order(ahead):
            taken.append(shard)
            yield shard
        if signature is not None:
            known[signature] = taken  # type: ignore[index]
