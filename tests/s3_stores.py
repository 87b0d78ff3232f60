"""Real S3 servers for the suite: moto's server mode and SeaweedFS, each a process on free ports.

Both answer boto3 and the aws CLI through the ordinary endpoint settings (`env_for`) with any
credentials. They differ where real stores differ: SeaweedFS publishes a multipart upload's
composite checksum as `…-N` with `x-amz-checksum-type: COMPOSITE`, moto without either; so the
S3 tests run over both (`s3_store` in conftest.py).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tests.readiness import answers_200, wait_until_ready

STORES = ("moto", "seaweedfs")
# `weed server` roles, each with an HTTP and a gRPC port; all chosen here, so parallel runs
# (and a developer's own SeaweedFS on the defaults 8333, 9333, 8080, 8888) cannot collide.
_WEED_ROLES = ("s3", "master", "volume", "filer")


@dataclass(frozen=True)
class S3Store:
    name: str  # one of STORES: the test id
    endpoint: str  # http://127.0.0.1:PORT


def env_for(endpoint: str) -> dict[str, str]:
    """The environment a daemon (or the aws CLI) needs to reach `endpoint`."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }


def client_for(endpoint: str, **config: object):  # type: ignore[no-untyped-def]
    """A boto3 S3 client for `endpoint`; `config` goes to botocore's Config."""
    import boto3
    import botocore.config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=botocore.config.Config(**config),  # type: ignore[arg-type]
    )


def _wait_ready(process: subprocess.Popen[bytes], url: str, what: str, log: Path | None) -> None:
    """Return once GET `url` answers 200; stop `process` and raise with the log's tail if it
    exits or START_TIMEOUT_S passes first."""
    try:
        wait_until_ready(f"{what} at {url}", answers_200(url), process=process, log=log)
    except AssertionError:
        _stop(process, grace_s=1)
        raise


def _stop(process: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server process; yields its endpoint."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(process, url + "/moto-api/", "moto server", None)
    try:
        yield url
    finally:
        _stop(process)


@contextlib.contextmanager
def seaweedfs_server(directory: Path, s3_config: Path | None = None) -> Iterator[str]:
    """`weed server` (master, volume, filer and S3 gateway in one process) over `directory`;
    yields the S3 endpoint. Without `s3_config` (SeaweedFS's identities JSON) no IAM
    configuration: any credentials are accepted; with it, only its identities'."""
    ports = {role: (free_port(), free_port()) for role in _WEED_ROLES}
    argv = ["weed", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={directory}", "-s3"]
    for role, (http, grpc) in ports.items():
        argv += [f"-{role}.port={http}", f"-{role}.port.grpc={grpc}"]
    argv += [
        # Listeners on by default at fixed ports: off (0 disables them), so runs never collide.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-metricsPort=0",
        # Unix sockets default to /tmp/seaweedfs-<role>-<port>.sock: keep ours in `directory`.
        f"-s3.localSocket={directory}/s3.sock",
        f"-filer.localSocket={directory}/filer.sock",
        "-master.telemetry=false",
        # Each bucket is a collection that grows 7 volumes at its first write, and a bucket with
        # none writable fails every upload (InternalError): room for 20 buckets. Volume files
        # grow with their data, so many small ones cost nothing.
        "-volume.max=140",
        "-master.volumeSizeLimitMB=64",
        *([f"-s3.config={s3_config}"] if s3_config else []),
    ]
    log = directory / "weed.log"
    with log.open("wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, cwd=directory)
    url = f"http://127.0.0.1:{ports['s3'][0]}"
    # With identities, "/" (ListBuckets) wants credentials: ask the gateway's health check.
    _wait_ready(process, url + ("/healthz" if s3_config else "/"), "SeaweedFS", log)
    try:
        yield url
    finally:
        _stop(process, grace_s=1)  # weed's graceful stop hangs on its gRPC servers: kill it
        # The gRPC listeners' unix sockets have no flag: remove the ones named by our ports.
        for role, (_, grpc) in ports.items():
            with contextlib.suppress(FileNotFoundError):  # removed by a graceful stop
                Path(f"/tmp/seaweedfs-{role}-grpc-{grpc}.sock").unlink()
