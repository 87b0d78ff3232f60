"""The loader-only install (`pip install shardcache`, no extra), as a training job gets it.

The package is built into a wheel from this tree, installed with `--no-index` (so a declared
dependency could not be met) into a fresh virtual environment that has nothing else, and run
there against a real daemon (the full install, started as users start it) on a `file://`
origin. WebDataset itself is not installed there: `prefetch_ahead` is a plain generator over
the `{"url": …}` dicts WebDataset hands its stages (tests/integration/test_webdataset.py runs
it inside a real WebDataset pipeline), and a training job installs `webdataset` itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.loader.sample import write_sample_shards
from tests.daemon_process import Daemon
from tests.integration.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
# The daemon's dependencies (the `daemon` extra) and what they pull in.
DAEMON_PACKAGES = {
    "aiohttp",
    "uvloop",
    "boto3",
    "botocore",
    "diskcache",
    "prometheus_client",
    "aiofiles",
    "tqdm",
    "braceexpand",
    "awscrt",
}

# Run inside the venv: the loader's public API against the daemon; prints what it saw.
LOADER_SCRIPT = """
import importlib.metadata, importlib.util, json, sys, time, urllib.request
import shardcache, shardcache.loader.client as client
from shardcache.loader.webdataset import prefetch_ahead

daemon, root, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
shards = [{"url": "pipe:curl -s -f " + client.local_url(f"{root}/{n}", daemon)} for n in names]
handed_on = list(prefetch_ahead(2)(iter(shards)))  # the daemon is the one the URLs name
batch = client.prefetch([f"file://{root}/{names[0]}"], daemon, warm=True)["batch"]
while not client.prefetch_status(batch, daemon)["batch"]["is_finished"]:
    time.sleep(0.05)
with urllib.request.urlopen(client.local_url(f"{root}/{names[0]}", daemon)) as response:
    first = response.read(), response.headers["X-Shardcache"]
print(json.dumps({
    "module": shardcache.__file__,
    "distributions": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()),
    "importable": sorted(n for n in sys.argv[4].split(",") if importlib.util.find_spec(n)),
    "loaded": sorted(n for n in sys.argv[4].split(",") if n in sys.modules),
    "handed_on": handed_on == shards,
    "urls": [s["url"] for s in shards],
    "first_bytes": first[0].hex(), "first_served_as": first[1],
}))
"""


def _clean_env() -> dict[str, str]:
    """This environment without what would let the venv see this tree or the daemon's
    packages (the suite runs with PYTHONPATH at the checkout), nor a configured daemon."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"}
    return {
        k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("SHARDCACHE_")
    }


def _pip(*argv: str | Path) -> None:
    """This Python's pip, quiet unless it fails."""
    command = [sys.executable, "-m", "pip", "-q", *map(str, argv)]
    done = subprocess.run(command, capture_output=True, text=True, env=_clean_env(), timeout=240)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr}"


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv (no pip, nothing else) holding the wheel of this tree, no extra."""
    base = tmp_path_factory.mktemp("light")
    source = base / "source"  # a copy: building in the checkout would leave build/ there
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(
        ROOT / "shardcache", source / "shardcache", ignore=shutil.ignore_patterns("__pycache__")
    )
    # The build backend (setuptools) comes from the package index or pip's cache, as for any
    # `pip install .`; the install then may use nothing but this one wheel.
    wheels, venv = base / "wheels", base / "venv"
    _pip("wheel", "--no-deps", "-w", wheels, source)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    _pip("--python", venv / "bin" / "python", "install", "--no-index", "-f", wheels, "shardcache")
    yield venv


def _run(
    venv: Path, *argv: str | Path, stderr: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a program of the venv from inside it, without this checkout on its path."""
    return subprocess.run(
        [*argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr,
        text=True,
        env=_clean_env(),
        timeout=60,
        cwd=venv,
    )


def _read_all(fd: int) -> str:
    """What a terminal received, once every writer closed it."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: Linux's answer on a pty whose other end is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def test_the_loader_only_install_has_no_dependency_and_talks_to_a_daemon(
    light_venv: Path, start_daemon, tmp_path: Path
) -> None:
    names = [p.name for p in write_sample_shards(tmp_path / "shards", 5, 8, 4096)]
    root = tmp_path / "shards"
    daemon: Daemon = start_daemon({"files": f"file://{root}"}, "--readahead", "0")
    python = light_venv / "bin" / "python"

    ran = _run(
        light_venv,
        python,
        "-c",
        LOADER_SCRIPT,
        daemon.url,
        str(root),
        ",".join(names[:4]),
        ",".join(sorted(DAEMON_PACKAGES)),
    )
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["module"].startswith(str(light_venv)), seen["module"]  # not this checkout
    assert seen["distributions"] == ["shardcache"]  # nothing else installed with it
    assert seen["importable"] == [] and seen["loaded"] == []
    assert seen["handed_on"]
    assert seen["urls"][1] == f"pipe:curl -s -f {daemon.url}/files/{names[1]}"
    # The stage asked for the 3 shards after the first; the warm prefetch, for the first.
    wait_for("4 prefetches", lambda: daemon.metric("shardcache_prefetch_completed_total") >= 4)
    assert daemon.metric("shardcache_prefetch_failed_total") == 0
    assert daemon.metric("shardcache_plans_active") == 1  # the stage posted its order too
    assert bytes.fromhex(seen["first_bytes"]) == (root / names[0]).read_bytes()
    assert seen["first_served_as"] == "hit"
    assert daemon.metric("shardcache_requests_total", origin="files", result="miss") == 0

    # The command: the client subcommands work there; the daemon's say what to install.
    shardcache = light_venv / "bin" / "shardcache"
    url = _run(light_venv, shardcache, "url", "--pipe", "--daemon", daemon.url, root / names[4])
    assert url.returncode == 0 and url.stdout == f"pipe:curl -s -f {daemon.url}/files/{names[4]}\n"
    # --wait with a terminal on stderr: a progress bar in the full install, lines here.
    primary, secondary = os.openpty()
    try:
        waited = _run(
            light_venv,
            shardcache,
            "prefetch",
            "--wait",
            "--daemon",
            daemon.url,
            root / names[4],
            stderr=secondary,
        )
        os.close(secondary)
        terminal = _read_all(primary)
    finally:
        os.close(primary)
    assert waited.returncode == 0, terminal
    assert "prefetch: 1/1 shards (100%)" in terminal and "Traceback" not in terminal, terminal
    for argv in (["serve"], ["demo", "--sample-dir", str(tmp_path / "demo")], ["verify"]):
        refused = _run(light_venv, shardcache, *argv)
        assert refused.returncode == 2, (argv, refused.stderr)
        lines = refused.stderr.splitlines()
        assert len(lines) == 1 and "pip install -c constraints.txt '.[daemon]'" in lines[0], (
            refused.stderr
        )
    assert not (tmp_path / "demo").exists()  # refused before writing its sample shards
