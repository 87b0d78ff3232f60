"""The container image, built from `deploy/docker/Dockerfile` and run: the daemon serves a shard
from a `file://` origin out of it, answers the image's own HEALTHCHECK, and stops on SIGTERM.

The image is built with buildah (`--isolation chroot`, `--pull=never`) and run with
`buildah run --isolation chroot`, no Docker engine or registry being reachable here; the base
image and the wheels are local stand-ins. What differs from a user's `docker build` and
`docker run` is written down in tests/container_image.py. A cold run (clean machine) takes
about 70 s, a warm one (base and wheels cached in /var/cache/shardcache-test) about 20 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from shardcache import __version__
from shardcache.loader.sample import write_sample_shards
from tests.container_image import (
    CACHE_DIR,
    Buildah,
    BuiltImage,
    base_image,
    build,
    qualified,
    require_tools,
    wheelhouse,
)
from tests.integration.helpers import curl, sha256
from tests.ports import free_port
from tests.readiness import answers_200, wait_until_ready

pytestmark = pytest.mark.timeout(900)  # a cold first run makes the base image: minutes

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
TAG = f"localhost/shardcache:test-{os.getpid()}"  # two runs at once build side by side
UID = 10001


@pytest.fixture(scope="module")
def buildah() -> Buildah:
    require_tools()
    return Buildah(CACHE_DIR / "containers")


@pytest.fixture(scope="module")
def image(buildah: Buildah) -> Iterator[BuiltImage]:
    """The image, built from this checkout (its base and wheels from the cache when there)."""
    started = time.monotonic()
    bases = {qualified(name) for name in DockerfileParser(path=str(DOCKERFILE)).parent_images}
    for name in bases:
        base_image(buildah, name)
    wheels = wheelhouse(ROOT)
    prepared = time.monotonic() - started
    built = build(buildah, ROOT, DOCKERFILE, TAG, wheels)
    print(f"base and wheels in {prepared:.1f} s; {TAG} built in {built.build_seconds:.1f} s")
    print(buildah("images", TAG).stdout)
    yield built
    buildah("rmi", "--force", TAG, check=False)


@pytest.fixture
def container(buildah: Buildah, image: BuiltImage) -> Iterator[str]:
    """A fresh container of the image (its own writable layer: the cache starts empty)."""
    name = buildah("from", "--pull=never", image.name).stdout.strip()
    yield name
    buildah("rm", name, check=False)


def _run_args(*mounts: str, env: dict[str, str] | None = None) -> list[str]:
    """`buildah run` options: chroot isolation, bind mounts, and `-e` variables."""
    args = ["run", "--isolation", "chroot"]
    for mount in mounts:
        args += ["--volume", mount]
    for name, value in (env or {}).items():
        args += ["--env", f"{name}={value}"]
    return args


def test_image_config_is_what_the_dockerfile_promises(image: BuiltImage) -> None:
    config = image.config
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["shardcache"] and config["Cmd"] == ["serve"]
    assert "8470/tcp" in config["ExposedPorts"]
    assert "/var/cache/shardcache" in config["Volumes"]
    assert config["Healthcheck"]["Test"][0] == "CMD", "HEALTHCHECK kept (Docker format)"
    env = dict(variable.split("=", 1) for variable in config["Env"])
    assert env["SHARDCACHE_LISTEN"] == "0.0.0.0:8470"
    assert env["SHARDCACHE_CONFIG"] == "/etc/shardcache/shardcache.toml"


def test_runs_as_uid_10001_and_reports_its_version(buildah: Buildah, container: str) -> None:
    for which in ("-u", "-g"):
        assert buildah(*_run_args(), container, "--", "id", which).stdout.strip() == str(UID)
    version = buildah(*_run_args(), container, "--", "shardcache", "--version")
    assert version.stdout.strip() == f"shardcache {__version__}"
    # Nothing of the build stage (sources, pip's cache) reached the final image.
    leftovers = buildah(*_run_args(), container, "--", "ls", "-d", "/src", "/install", check=False)
    assert leftovers.returncode != 0, leftovers.stdout


def test_image_holds_every_file_of_the_package(buildah: Buildah, container: str) -> None:
    """A data file the wheel leaves out (package-data not declared) would be missing here."""
    source = ROOT / "shardcache"
    wanted = {
        str(path.relative_to(source))
        for path in source.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    root = Path(buildah("mount", container).stdout.strip())
    try:
        (installed,) = (root / "usr" / "local" / "lib").glob("python3.*/site-packages/shardcache")
        have = {str(path.relative_to(installed)) for path in installed.rglob("*") if path.is_file()}
    finally:
        buildah("umount", container)
    assert not wanted - have, f"missing from the image: {sorted(wanted - have)}"


def test_refuses_to_listen_beyond_loopback_without_a_token(
    buildah: Buildah, image: BuiltImage, container: str
) -> None:
    """As documented: on the image's 0.0.0.0 without an admin token, one line and exit 2."""
    command = [*image.config["Entrypoint"], *image.config["Cmd"]]
    result = buildah(*_run_args(), container, "--", *command, check=False, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "token" in result.stderr and "Traceback" not in result.stderr


def _children(pid: int) -> list[int]:
    """Children of every thread of `pid` (buildah is Go: any thread may have forked)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in children.read_text().split()]
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return sorted(found)


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def _container_command_pid(runner: subprocess.Popen[bytes]) -> int:
    """The container's command: the child of buildah's `buildah-chroot-exec` (what `docker
    stop` signals as the container's PID 1)."""
    for pid in _descendants(runner.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[0] == b"buildah-chroot-exec" and _children(pid):
            return _children(pid)[0]
    raise AssertionError("no buildah-chroot-exec under `buildah run`")


def _wait_ready(url: str, runner: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    wait_until_ready(
        f"the container's daemon on {url}",
        answers_200(url + "/readyz"),
        process=runner,
        log=log,
        timeout_s=timeout_s,
    )


def _status(proc: int) -> dict[str, str]:
    lines = Path(f"/proc/{proc}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _is_alive(pid: int) -> bool:
    try:
        return _status(pid)["State"][0] not in "ZX"
    except FileNotFoundError:
        return False


def test_daemon_serves_a_shard_answers_its_healthcheck_and_stops_on_sigterm(
    buildah: Buildah, image: BuiltImage, container: str, tmp_path: Path
) -> None:
    # The shards and the config are bind-mounted read-only, as `docker run -v` would; uid 10001
    # reads them. The daemon listens on a free loopback port (chroot isolation shares this
    # machine's network) and requires the admin token, read from a 0400 file owned by 10001.
    shards = tmp_path / "shards"
    shard = write_sample_shards(shards, shards=1, samples_per_shard=32)[0]
    shards.chmod(0o755)
    shard.chmod(0o644)
    config = tmp_path / "shardcache.toml"
    config.write_text('cache_size = "1GiB"\n\n[origins.data]\nurl = "file:///data/shards"\n')
    config.chmod(0o644)
    token = tmp_path / "admin-token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o400)
    os.chown(token, UID, UID)
    port = free_port()
    env = {
        "SHARDCACHE_LISTEN": f"127.0.0.1:{port}",
        "SHARDCACHE_ADMIN_TOKEN_FILE": "/run/secrets/admin-token",
    }
    mounts = (
        f"{shards}:/data/shards:ro",
        f"{config}:/etc/shardcache/shardcache.toml:ro",
        f"{token}:/run/secrets/admin-token:ro",
    )
    command = [*image.config["Entrypoint"], *image.config["Cmd"]]
    log = tmp_path / "daemon.log"
    runner = buildah.popen(*_run_args(*mounts, env=env), container, "--", *command, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, runner, log, timeout_s=60)
        daemon = _container_command_pid(runner)
        status = _status(daemon)
        assert status["Uid"].split() == [str(UID)] * 4 and status["Gid"].split() == [str(UID)] * 4
        assert os.readlink(f"/proc/{daemon}/root") != "/", "the daemon runs in the image's root"

        first = curl(f"{url}/data/{shard.name}")
        assert first.status == 200 and first.sha256 == sha256(shard.read_bytes())
        assert first.headers["x-shardcache"] == "miss"
        second = curl(f"{url}/data/{shard.name}")
        assert second.headers["x-shardcache"] == "hit" and second.sha256 == first.sha256
        # The hit came off the image's cache volume, written there by uid 10001.
        cache = Path(f"/proc/{daemon}/root/var/cache/shardcache")
        cached = [
            p for p in cache.rglob("*") if p.is_file() and p.stat().st_size == shard.stat().st_size
        ]
        assert cached and all(p.stat().st_uid == UID for p in cached)

        # The image's own HEALTHCHECK command, run in the container with the container's
        # variables, as the engine runs it: it follows SHARDCACHE_LISTEN to the daemon's port.
        healthcheck = image.config["Healthcheck"]["Test"][1:]
        health_run = [*_run_args(env=env), container, "--", *healthcheck]
        assert buildah(*health_run, check=False, timeout=30).returncode == 0

        # docker stop: SIGTERM to the container's command; it drains and exits 0 in seconds.
        processes = [daemon, *_descendants(daemon)]
        stopping = time.monotonic()
        os.kill(daemon, signal.SIGTERM)
        code = runner.wait(timeout=30)
        assert code == 0, log.read_text()
        assert time.monotonic() - stopping < 15
        assert not [pid for pid in processes if _is_alive(pid)], "a process outlived the daemon"
    finally:
        # Killing `buildah run` leaves the container's processes running: kill them first.
        if runner.poll() is None:
            for pid in _descendants(runner.pid):
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, signal.SIGKILL)
            runner.kill()
            runner.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("message") == "stopped" for line in lines), log.read_text()
    assert "Traceback" not in log.read_text()
    # With the daemon gone, the same HEALTHCHECK fails: it can tell.
    assert buildah(*health_run, check=False, timeout=30).returncode != 0
