"""Three nodes over SeaweedFS's read-through cluster cache against nodes straight to the store
(issue 37). `python benchmarks/seaweedfs_cluster.py` from the repository root; about a minute a
run on two cores.

The store ("the cloud") is moto behind a counting proxy (tests/s3_fault_proxy.py), so every
byte it sends is counted, whoever asks. Each node is a daemon (as users start it) read by
`curl -s -f` over every shard in its own shuffled order, the three nodes at once. Arms, each on
fresh daemons, caches and SeaweedFS:
- straight: the nodes' origin is the bucket (`url = "s3://cloud/laion"`);
- seaweedfs cold: `urls = [SeaweedFS, the bucket]`, the bucket mounted read-through
  (`remote.mount`, default `-cacheWait`), nothing cached before the nodes read;
- seaweedfs warmed: the same after `remote.cache` (its time given apart).
Prints one line per arm: origin bytes against the dataset, and the loaders' wall time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon_process import Daemon  # noqa: E402
from tests.fault_origin import Faults  # noqa: E402
from tests.s3_fault_proxy import S3FaultProxy  # noqa: E402
from tests.s3_stores import client_for, env_for, moto_server, seaweedfs_cloud_drive  # noqa: E402

MiB = 1 << 20
BUCKET, PREFIX = "cloud", "laion"


@contextlib.contextmanager
def _proxy(upstream: str) -> Iterator[S3FaultProxy]:
    proxy = S3FaultProxy(upstream, Faults(enabled=False))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _read_all(nodes: list[Daemon], keys: list[str]) -> float:
    """Every node reads every key with curl in its own order, all at once: the wall time."""

    def one(index: int) -> None:
        order = keys[:]
        random.Random(index).shuffle(order)
        for key in order:
            subprocess.run(
                ["curl", "-s", "-f", "-o", "/dev/null", f"{nodes[index].url}/{PREFIX}/{key}"],
                check=True,
            )

    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(one, range(len(nodes))))
    return time.monotonic() - began


def _nodes(work: Path, count: int, urls: list[str], home: str) -> list[Daemon]:
    config = work / "node.toml"
    listed = ", ".join(f'"{u}"' for u in urls)
    config.write_text(f'[origins.{PREFIX}]\nurls = [{listed}]\nendpoint_url = "{home}"\n')
    return [
        Daemon(work / f"node{i}", {}, "--config", str(config), env=env_for(home))
        for i in range(count)
    ]


def run_once(moto: str, keys: list[str], dataset: int, nodes_n: int, arm: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, _proxy(moto) as cloud:
        work = Path(tmp)
        (work / "weed").mkdir()
        nodes: list[Daemon] = []
        try:
            with contextlib.ExitStack() as stack:
                warm_s = 0.0
                if arm == "straight":
                    urls = [f"s3://{BUCKET}/{PREFIX}"]
                else:
                    drive = stack.enter_context(seaweedfs_cloud_drive(work / "weed"))
                    drive.mount(cloud.url, f"{BUCKET}/{PREFIX}", f"/buckets/{PREFIX}")
                    if arm == "seaweedfs warmed":
                        began = time.monotonic()
                        drive.shell(f"remote.cache -dir=/buckets/{PREFIX}")
                        warm_s = time.monotonic() - began
                    urls = [f"{drive.endpoint}/{PREFIX}", f"s3://{BUCKET}/{PREFIX}"]
                nodes = _nodes(work, nodes_n, urls, cloud.url)
                wall_s = _read_all(nodes, keys)
                return {
                    "origin_mb": sum(cloud.get_bytes.values()) / 1e6,
                    "x_dataset": sum(cloud.get_bytes.values()) / dataset,
                    "wall_s": wall_s,
                    "warm_s": warm_s,
                }
        finally:
            for node in nodes:
                node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mib", type=int, default=8)
    args = parser.parse_args()
    arms = ("straight", "seaweedfs cold", "seaweedfs warmed")
    with moto_server() as moto, tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        client = client_for(moto)
        client.create_bucket(Bucket=BUCKET)
        keys = [f"shard-{i:03d}.tar" for i in range(args.shards)]
        for key in keys:
            path = Path(tmp) / key
            path.write_bytes(os.urandom(args.shard_mib * MiB + 4096))  # over 8 MiB: multipart
            client.upload_file(str(path), BUCKET, f"{PREFIX}/{key}")
        dataset = args.shards * (args.shard_mib * MiB + 4096)
        shape = f"{args.nodes} nodes, {args.shards} shards of {args.shard_mib} MiB"
        print(f"{shape}: {dataset / 1e6:.0f} MB")
        results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
        for _ in range(args.runs):
            for arm in arms:
                results[arm].append(run_once(moto, keys, dataset, args.nodes, arm))
        for arm in arms:
            rows = results[arm]

            def median(field: str) -> str:
                values = [r[field] for r in rows]  # noqa: B023
                return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

            print(
                f"{arm}: origin MB {median('origin_mb')}, x dataset {median('x_dataset')}, "
                f"wall s {median('wall_s')}, warming s {median('warm_s')}"
            )


if __name__ == "__main__":
    main()
