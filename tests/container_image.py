"""Build `deploy/docker/Dockerfile` with buildah on a machine that reaches no container registry.

The build machines run no Docker engine and reach only the package indexes (PyPI, Debian's
mirrors), so three things stand in for what a user's `docker build` would download:

- **The base image.** The Dockerfile's `FROM python:3.11.10-slim-bookworm` is answered by a
  local image of that name, made here and kept in the suite's own container storage
  (`/var/cache/shardcache-test/containers`, never the machine's `/var/lib/containers`, so no
  other build on the machine can pick it up): Debian bookworm `minbase` from `mmdebstrap`, with
  the runtime packages the real image adds (`ca-certificates`, `netbase`, `tzdata` and the
  libraries its Python's extension modules link), and the CPython that runs this suite copied
  into `/usr/local` as the real image has it (`/usr/local/bin/python3.X`, `python3`, `python`,
  `libpython` in `/usr/local/lib`, the standard library without `test`/`tests`/`idle_test`,
  `__pycache__`, `libpython*.a`, `site-packages` or tkinter's C module) with pip from its own
  `ensurepip`.
  What differs from the real base: the Python patch release (this machine's, e.g. 3.11.7, not
  3.11.10; the minor version must match the FROM line, which is checked), pip and setuptools
  (ensurepip's bundled ones, e.g. pip 23.2.1 and setuptools 65.5.0, not 24.0 and 65.5.1, and no
  `wheel`), Debian's package versions (today's bookworm point release, not the image's date),
  the Python build options (pyenv's, not the official image's `--enable-optimizations --with-lto`
  and `--strip-all`: libpython and the extension modules here keep their symbols, about 30 MB
  more), and the image config (the same `PATH`, `LANG` and `CMD ["python3"]`, no `GPG_KEY`).
- **The package index inside the build.** This machine reaches PyPI only through a proxy whose
  CA the base image does not trust, so the wheels are downloaded here (`pip download`, the
  versions `constraints.txt` pins) and the build is given them with `-v WHEELS:/wheels:ro
  --build-arg WHEELHOUSE=/wheels`: the Dockerfile's `pip install` then reads only that
  directory (`--no-index --find-links`). Without the argument it uses the index, as for users.
- **The container runtime.** `buildah run --isolation chroot` instead of `docker run`: the
  process runs as the image's user in the image's filesystem, but in the host's network and
  PID namespaces (so the daemon listens on a loopback port of this machine, and is not PID 1),
  with no cgroup limits, and buildah does not forward signals: SIGTERM goes to the container's
  command itself, as `docker stop` sends it to the container's PID 1.

Both the base image and the wheels are cached under /var/cache/shardcache-test, keyed by what
made them: a second run reuses them; a clean machine makes them (about 50 s on two busy cores:
mmdebstrap 31 s, where debootstrap took 51 s for a bigger tree, and the wheels 17 s). The image
under test is built afresh on every run (no layer cache; 9-13 s).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_DIR = Path("/var/cache/shardcache-test")
BASE_KEY_LABEL = "org.shardcache.test.base-key"
SUITE = "bookworm"
SOURCES = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
# What python:3.X-slim-bookworm installs on debian:bookworm-slim: ca-certificates, netbase and
# tzdata, then the libraries its Python's extension modules link (most are in minbase already).
PACKAGES = (
    "ca-certificates",
    "netbase",
    "tzdata",
    "libbz2-1.0",
    "libcrypt1",
    "libffi8",
    "liblzma5",
    "libncursesw6",
    "libnsl2",
    "libreadline8",
    "libsqlite3-0",
    "libssl3",
    "libtirpc3",
    "libuuid1",
    "zlib1g",
)
# debian:bookworm-slim's dpkg filter (debuerreotype --slimify): no docs, man pages or locales.
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
# minbase: Essential, Priority required, apt. The merged-usr hook makes /bin a link to /usr/bin
# as bookworm-slim has it, without the usrmerge package (which would bring all of perl).
MMDEBSTRAP_OPTIONS = ("--variant=minbase", "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr")
RECIPE_VERSION = 1  # bump when the recipe changes in a way the key below cannot see
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
BASE_ENV = (
    "PATH=/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    f"PYTHON_VERSION={sys.version.split()[0]}",
)


def require_tools() -> None:
    """Install buildah and mmdebstrap with apt-get when missing (as root), or fail saying so."""
    assert os.geteuid() == 0, "building the image needs root (buildah with the host's storage)"
    missing = [tool for tool in ("buildah", "mmdebstrap") if not shutil.which(tool)]
    if not missing:
        return
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, capture_output=True, env=environ).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=environ)
        result = subprocess.run(install, capture_output=True, text=True, env=environ)
        assert result.returncode == 0, f"apt-get install {' '.join(missing)}:\n{result.stderr}"


class Buildah:
    """`buildah` on the suite's own container storage, with chroot isolation for RUN."""

    def __init__(self, storage: Path) -> None:
        self.argv = [
            "buildah",
            "--root",
            str(storage / "storage"),
            "--runroot",
            str(storage / "run"),
            "--storage-driver",
            "overlay",
        ]

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.argv, *args], capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert result.returncode == 0, f"buildah {' '.join(args)}:\n{result.stderr}"
        return result

    def popen(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as stream:
            return subprocess.Popen([*self.argv, *args], stdout=stream, stderr=subprocess.STDOUT)

    def image_config(self, image: str) -> dict[str, Any] | None:
        """The image's Docker-format config (User, Env, Entrypoint, Healthcheck), or None."""
        result = self("inspect", "--type", "image", image, check=False)
        if result.returncode != 0:
            return None
        config: dict[str, Any] = json.loads(result.stdout)["Docker"]["config"]
        return config


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """One pytest run at a time makes a cached thing; the others wait, then reuse it."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def qualified(image: str) -> str:
    """`python:3.11` as Docker resolves it: docker.io/library/python:3.11."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


def base_image(buildah: Buildah, name: str) -> str:
    """Return `name` (the Dockerfile's FROM image, qualified), making the stand-in unless it is
    cached."""
    python_version = name.split(":", 1)[1].split("-", 1)[0]
    assert python_version.split(".")[:2] == PYTHON.split("."), (
        f"the Dockerfile's base is Python {python_version}: the stand-in is this machine's "
        f"Python {PYTHON}; run the suite on the same minor version"
    )
    key = _key(
        RECIPE_VERSION,
        MMDEBSTRAP_OPTIONS,
        SOURCES,
        PACKAGES,
        SLIM_DPKG_OPTIONS,
        sys.version,
        BASE_ENV,
    )
    with _locked("base"):
        config = buildah.image_config(name)
        if config and (config.get("Labels") or {}).get(BASE_KEY_LABEL) == key:
            return name
        if config:
            buildah("rmi", "--force", name)
        container = buildah("from", "scratch").stdout.strip()
        try:
            _make_base(buildah, container, key)
            buildah("commit", "--rm", "--format", "docker", container, name)
        except BaseException:
            buildah("rm", container, check=False)
            raise
    return name


def _make_base(buildah: Buildah, container: str, key: str) -> None:
    root = Path(buildah("mount", container).stdout.strip())
    try:
        debian = subprocess.run(
            [
                "mmdebstrap",
                *MMDEBSTRAP_OPTIONS,
                "--include=" + ",".join(PACKAGES),
                *(f"--dpkgopt={option}" for option in SLIM_DPKG_OPTIONS),
                SUITE,
                str(root),
                *SOURCES,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert debian.returncode == 0, f"mmdebstrap:\n{debian.stderr[-4000:]}"
        _copy_python(root)
    finally:
        buildah("umount", container)
    run = ("run", "--isolation", "chroot", container, "--")
    buildah(*run, "/sbin/ldconfig")
    buildah(*run, "/usr/local/bin/python3", "-m", "ensurepip", "--default-pip")
    check = "import bz2, ctypes, hashlib, lzma, readline, sqlite3, ssl, uuid, zlib, sys; "
    check += "ssl.create_default_context(); print(sys.prefix)"
    prefix = buildah(*run, "python", "-c", check).stdout.strip()
    assert prefix == "/usr/local", prefix
    env = [f"--env={variable}" for variable in BASE_ENV]
    buildah("config", *env, "--cmd", "python3", "--label", f"{BASE_KEY_LABEL}={key}", container)


def _copy_python(root: Path) -> None:
    """This machine's CPython into `root`/usr/local, laid out as the python image has it."""
    prefix = Path(sys.base_prefix)
    executable = prefix / "bin" / f"python{PYTHON}"
    assert executable.is_file(), f"{executable}: the stand-in needs a CPython built into a prefix"
    local = root / "usr" / "local"
    (local / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(executable, local / "bin" / f"python{PYTHON}")
    (local / "bin" / "python3").symlink_to(f"python{PYTHON}")
    (local / "bin" / "python").symlink_to("python3")
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        soname = str(sysconfig.get_config_var("INSTSONAME"))
        libdir = Path(str(sysconfig.get_config_var("LIBDIR")))
        shutil.copy2(libdir / soname, local / "lib" / soname)
        (local / "lib" / f"libpython{PYTHON}.so").symlink_to(soname)
    stdlib = Path(sysconfig.get_path("stdlib"))
    skip = shutil.ignore_patterns(
        "site-packages",
        "test",
        "tests",
        "idle_test",
        "__pycache__",
        "*.pyc",
        "_tkinter*",
        "libpython*.a",
    )
    shutil.copytree(stdlib, local / "lib" / f"python{PYTHON}", symlinks=True, ignore=skip)
    (local / "lib" / f"python{PYTHON}" / "site-packages").mkdir()


def wheelhouse(repo: Path) -> Path:
    """The wheels the Dockerfile's `pip install` needs, downloaded here (cached by their pins)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    wanted = [  # the daemon's dependencies (the `daemon` extra), and what builds the wheel
        *project["project"]["optional-dependencies"]["daemon"],
        *project["build-system"]["requires"],
    ]
    pins = (repo / "constraints.txt").read_text()
    directory = CACHE_DIR / "wheels" / _key(wanted, pins, sys.version_info[:2], sys.platform)
    with _locked("wheels"):
        if directory.is_dir():
            return directory
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
            + ["--dest", str(partial), "-c", str(repo / "constraints.txt"), *wanted],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"pip download:\n{result.stderr[-4000:]}"
        partial.rename(directory)
    return directory


@dataclass(frozen=True)
class BuiltImage:
    name: str
    config: dict[str, Any]
    build_seconds: float
    size: str


def build(buildah: Buildah, repo: Path, dockerfile: Path, tag: str, wheels: Path) -> BuiltImage:
    """`buildah build` of `dockerfile` with the repository as its context, registries never
    asked (`--pull=never`), the wheels mounted for the Dockerfile's pip; Docker format, which
    keeps HEALTHCHECK (OCI has no field for it)."""
    started = time.monotonic()
    buildah(
        "build",
        "--isolation",
        "chroot",
        "--pull=never",
        "--format",
        "docker",
        "--file",
        str(dockerfile),
        "--tag",
        tag,
        "--volume",
        f"{wheels}:/wheels:ro",
        "--build-arg",
        "WHEELHOUSE=/wheels",
        str(repo),
    )
    seconds = time.monotonic() - started
    config = buildah.image_config(tag)
    assert config is not None
    size = buildah("images", "--format", "{{.Size}}", tag).stdout.strip()
    return BuiltImage(tag, config, seconds, size)
