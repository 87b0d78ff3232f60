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


def _weed_argv(directory: Path, ports: dict[str, tuple[int, int]], extra: list[str]) -> list[str]:
    """`weed server` with master, volume, filer and S3 gateway on `ports` (role: HTTP, gRPC)."""
    argv = ["weed", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={directory}", "-s3"]
    for role, (http, grpc) in ports.items():
        argv += [f"-{role}.port={http}", f"-{role}.port.grpc={grpc}"]
    return [
        *argv,
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
        *extra,
    ]


def _remove_grpc_sockets(ports: dict[str, tuple[int, int]]) -> None:
    """The gRPC listeners' unix sockets have no flag: remove the ones named by `ports`."""
    for role, (_, grpc) in ports.items():
        with contextlib.suppress(FileNotFoundError):  # removed by a graceful stop
            Path(f"/tmp/seaweedfs-{role}-grpc-{grpc}.sock").unlink()


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
    argv = _weed_argv(directory, ports, [f"-s3.config={s3_config}"] if s3_config else [])
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
        _remove_grpc_sockets(ports)


# SeaweedFS refuses to read a remote bucket on a loopback or link-local endpoint (an SSRF
# guard) unless each server that fetches from it is told to (`weed server -h`, 4.x).
_UNTRUSTED_REMOTES = (
    "-filer.allowUntrustedRemoteEndpoints",
    "-s3.allowUntrustedRemoteEndpoints",
    "-volume.allowUntrustedRemoteEndpoints",
)


class SeaweedFSCloudDrive:
    """`weed server` over `directory` with a remote S3 bucket mounted read-through (SeaweedFS's
    "cloud drive": `remote.configure`, `remote.mount`), on ports fixed at construction so it can
    be killed (SIGKILL) and started again where its clients expect it, with its data and mounts.

    `mount` points a directory of the filer at the remote bucket; the S3 gateway serves it as
    the bucket named by the directory (`/buckets/laion` is `http://S3/laion/…`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ports = {role: (free_port(), free_port()) for role in _WEED_ROLES}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3'][0]}"
        self.log = directory / "weed.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def master(self) -> str:
        """The master as `weed shell -master` takes it off the default ports: HOST:PORT.GRPC."""
        http, grpc = self.ports["master"]
        return f"127.0.0.1:{http}.{grpc}"

    def start(self) -> None:
        """Start it and return once its S3 gateway answers ListBuckets."""
        _remove_grpc_sockets(self.ports)  # a killed server leaves them, and they block a bind
        for name in ("s3.sock", "filer.sock"):
            with contextlib.suppress(FileNotFoundError):  # none after a clean stop
                (self.directory / name).unlink()
        # A restarted master waits out its election timeout (10 s) before it leads again.
        argv = _weed_argv(
            self.directory, self.ports, [*_UNTRUSTED_REMOTES, "-master.electionTimeout=1s"]
        )
        with self.log.open("ab") as output:
            self._process = subprocess.Popen(
                argv, stdout=output, stderr=subprocess.STDOUT, cwd=self.directory
            )
        _wait_ready(self._process, self.endpoint + "/", "SeaweedFS", self.log)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients, its listeners gone at once."""
        assert self._process is not None
        self._process.kill()
        self._process.wait(10)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            _stop(self._process, grace_s=1)
        _remove_grpc_sockets(self.ports)

    def shell(self, *commands: str, timeout_s: float = 120) -> str:
        """Run `commands` in `weed shell` and return what it printed; raise AssertionError
        naming the output when a command reports an error. The shell waits for the master's
        cluster to form, so a fresh server may take a while to answer: `timeout_s` bounds it."""
        script = "\n".join((*commands, "exit")) + "\n"
        done = subprocess.run(
            ["weed", "shell", f"-master={self.master}"],
            input=script.encode(),
            capture_output=True,
            timeout=timeout_s,
            cwd=self.directory,
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
        if done.returncode != 0 or "error" in output.lower():
            raise AssertionError(f"weed shell {commands} failed ({done.returncode}):\n{output}")
        return output

    def mount(self, remote_endpoint: str, bucket: str, directory: str, *options: str) -> None:
        """Mount `bucket` of the S3 store at `remote_endpoint` at `directory`, read through;
        `options` go to `remote.mount` (`-cacheWait=0`)."""
        self.shell(
            "remote.configure -name=cloud1 -type=s3 -s3.access_key=testing "
            f"-s3.secret_key=testing -s3.region=us-east-1 -s3.endpoint={remote_endpoint}",
            " ".join(["remote.mount", f"-dir={directory}", f"-remote=cloud1/{bucket}", *options]),
        )


@contextlib.contextmanager
def seaweedfs_cloud_drive(directory: Path) -> Iterator[SeaweedFSCloudDrive]:
    """A started `SeaweedFSCloudDrive` over `directory`, stopped on exit."""
    drive = SeaweedFSCloudDrive(directory)
    drive.start()
    try:
        yield drive
    finally:
        drive.stop()
