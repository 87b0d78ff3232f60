"""The processes a benchmark run starts: the simulated origin, shardcache, and nginx (as an
expertly configured caching proxy and as a plain static file server), each on a free port."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Return once `url` answers at all; a try refused, reset or timed out (TimeoutError is an
    OSError) is retried until `timeout_s`, generous for a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s: {exc}") from None
            time.sleep(0.05)


class Process:
    def __init__(
        self, argv: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.log = log
        self.log_file = log.open("wb")
        self.process = subprocess.Popen(
            argv, stdout=self.log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            wait_http(ready_url, self.process)
        except RuntimeError as error:
            # Say why in the message (the process's own last words), not just an exit status
            # after a long argv, and leave nothing running behind a failed start.
            self.stop()
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(
                f"did not start: {error}; its log ({log}) ends: " + (" | ".join(tail) or "(empty)")
            ) from None

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()


class SimOrigin(Process):
    def __init__(
        self,
        workdir: Path,
        ttfb_ms: float = 0,
        conn_rate: float = 0,
        total_rate: float = 0,
        files: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "simorigin.py"),
                "--port",
                str(self.port),
                "--ttfb-ms",
                str(ttfb_ms),
                "--conn-rate",
                str(conn_rate),
                "--total-rate",
                str(total_rate),
                *(["--files", str(files)] if files else []),
            ],
            self.url + "/_stats",
            workdir / f"simorigin-{self.port}.log",
        )

    def stats(self) -> dict[str, object]:
        with urllib.request.urlopen(self.url + "/_stats", timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]


class Shardcache(Process):
    def __init__(
        self,
        workdir: Path,
        origins: dict[str, str],
        *extra: str,
        env: dict[str, str] | None = None,
        cache_size: str = "40GiB",
        receivers: int | None = None,
    ) -> None:
        """`receivers`: the receiver pool's size (`--receivers`); None passes nothing, so the
        daemon's own default (or SHARDCACHE_RECEIVERS) applies, and a daemon without the
        option still starts."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cache_dir = workdir / f"shardcache-{self.port}"
        argv = [
            sys.executable,
            "-m",
            "shardcache",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--cache-dir",
            str(self.cache_dir),
            "--cache-size",
            cache_size,
            "--log-level",
            "warning",
            "--readahead",
            "0",
            *([] if receivers is None else ["--receivers", str(receivers)]),
            *extra,
        ]
        for name, url in origins.items():
            argv += ["--origin", f"{name}={url}"]
        super().__init__(
            argv, self.url + "/readyz", workdir / f"shardcache-{self.port}.log", env=env
        )

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.cache_dir, ignore_errors=True)


NGINX_CONF = """
user root;
worker_processes 2;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    # tcp_nopush (TCP_CORK) is often paired with sendfile, but on keep-alive connections it
    # stalls small responses for the 40 ms delayed-ACK timer (750 req/s instead of 44k here).
    tcp_nopush off;
    keepalive_requests 100000;
    client_body_temp_path {workdir}/client_temp;
    proxy_temp_path {workdir}/proxy_temp;
    fastcgi_temp_path {workdir}/fastcgi_temp;
    uwsgi_temp_path {workdir}/uwsgi_temp;
    scgi_temp_path {workdir}/scgi_temp;
    # A caching reverse proxy set up for large, immutable shards: cache files are written in
    # place (no temp-path copy), concurrent misses wait on one fetch (cache lock), hits go out
    # through sendfile.
    proxy_cache_path {workdir}/cache levels=1:2 keys_zone=shards:64m max_size=40g
                     inactive=7d use_temp_path=off;
    server {{
        listen 127.0.0.1:{proxy_port};
        location / {{
            proxy_pass {origin};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache shards;
            proxy_cache_key $uri;
            proxy_cache_valid 200 7d;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 10m;
            proxy_cache_lock_age 10m;
            proxy_buffering on;
            proxy_buffer_size 256k;
            proxy_buffers 64 256k;
            proxy_busy_buffers_size 1m;
            proxy_read_timeout 300s;{proxy_tls}
        }}
    }}
    server {{
        listen 127.0.0.1:{static_port};
        root {static_root};
        location / {{ }}
    }}{tls_server}
}}
"""
# With `tls`: the static files over HTTPS too (the origin of the TLS scenario), and the proxy
# verifying its HTTPS upstream as shardcache does (the certificate names localhost).
TLS_SERVER = """
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        root {static_root};
        location / {{ }}
    }}"""
PROXY_TLS = """
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {cert};
            proxy_ssl_name localhost;
            proxy_ssl_session_reuse on;
            proxy_ssl_protocols TLSv1.3;"""


class Nginx(Process):
    """nginx as caching proxy in front of `origin` (port `proxy_port`) and as a static file
    server of `static_root` (port `static_port`)."""

    def __init__(
        self,
        workdir: Path,
        origin: str | None,
        static_root: Path,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """With `tls` (certificate, key), `static_root` is also served over HTTPS at
        `tls_url`, which is then the proxy's origin unless `origin` is given."""
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.workdir = workdir / f"nginx-{free_port()}"
        self.workdir.mkdir(parents=True)
        self.proxy_port, self.static_port = free_port(), free_port()
        self.proxy_url = f"http://127.0.0.1:{self.proxy_port}"
        self.static_url = f"http://127.0.0.1:{self.static_port}"
        self.tls_port = free_port()
        self.tls_url = f"https://127.0.0.1:{self.tls_port}"
        tls_server = proxy_tls = ""
        if tls is not None:
            cert, key = tls
            tls_server = TLS_SERVER.format(
                tls_port=self.tls_port, cert=cert, key=key, static_root=static_root
            )
            proxy_tls = PROXY_TLS.format(cert=cert)
        origin = origin or (self.tls_url if tls is not None else self.static_url)
        conf = self.workdir / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(
                workdir=self.workdir,
                proxy_port=self.proxy_port,
                static_port=self.static_port,
                origin=origin,
                static_root=static_root,
                tls_server=tls_server,
                proxy_tls=proxy_tls,
            )
        )
        super().__init__(
            [nginx, "-c", str(conf), "-p", str(self.workdir)],
            self.static_url + "/",
            self.workdir / "nginx.log",
        )

    def worker_pids(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def self_signed(workdir: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key, made with openssl."""
    cert, key = workdir / "tls-cert.pem", workdir / "tls-key.pem"
    subprocess.run(
        [
            shutil.which("openssl") or "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (so [0] is field 3, the state)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of `pids` themselves (all their threads), from /proc: not their
    children, live or exited (see `cpu_snapshot` for those)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = _stat(pid)
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, …), read from
    /proc/PID/task/TID/children of each thread: a child is listed under the thread that forked
    it, so reading only the main thread's file misses children spawned from other threads.
    Processes that exit while the tree is walked are skipped, not an error."""
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:  # gone
            continue
        for task in tasks:
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except OSError:  # the thread or the process is gone
                continue
            for child in children:
                if child not in found:
                    found.append(child)
                    parents.append(child)
    return found


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of some root processes and of everything below them, at one moment.

    Descendants come and go (a receiver pool may spawn lazily or replace a worker), so each is
    keyed by (pid, start time): a pid reused by a new process is a new process. A descendant
    that exits and is waited for by a root between two snapshots is not lost: the kernel adds
    its whole lifetime's CPU (its own and its waited-for children's) to the root's cutime and
    cstime, which `reaped` holds.
    """

    own: float  # the roots' user + system time
    reaped: float  # the roots' cutime + cstime: descendants that exited and were waited for
    below: dict[tuple[int, int], float]  # (pid, start time) -> user+system+cutime+cstime


def cpu_snapshot(roots: list[int]) -> CpuSnapshot:
    """CPU of `roots` (which must be alive) and of every descendant alive (or a zombie) now."""
    ticks = os.sysconf("SC_CLK_TCK")
    own = reaped = 0.0
    for pid in roots:
        fields = _stat(pid)
        own += (int(fields[11]) + int(fields[12])) / ticks
        reaped += (int(fields[13]) + int(fields[14])) / ticks
    below: dict[tuple[int, int], float] = {}
    for root in roots:
        for pid in descendants(root):
            if pid in roots:
                continue  # counted as a root (nginx: the workers are the master's children)
            try:
                fields = _stat(pid)
            except OSError:  # exited and reaped since the tree was read: `reaped` has it
                continue
            below[pid, int(fields[19])] = sum(int(f) for f in fields[11:15]) / ticks
    return CpuSnapshot(own, reaped, below)


def cpu_between(before: CpuSnapshot, after: CpuSnapshot) -> tuple[float, float]:
    """CPU seconds spent between two snapshots of the same roots: (the roots themselves, their
    descendants). A descendant seen at both counts its growth; one born since counts all it
    has; one gone by `after` counts what it spent after `before` through the roots' `reaped`
    (its lifetime total there, less what `before` had already seen of it). Not counted: what
    a descendant spent after the last snapshot that saw it, when something other than a root
    or a seen descendant waited for it (re-parented to init), and a process born and gone
    between the snapshots that way too."""
    grown = sum(cpu - before.below.get(key, 0.0) for key, cpu in after.below.items())
    gone = sum(cpu for key, cpu in before.below.items() if key not in after.below)
    return after.own - before.own, grown + (after.reaped - before.reaped) - gone


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
