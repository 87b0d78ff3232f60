"""Start the daemon the way a user does (`python -m shardcache serve …`) on a free port."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.ports import free_port
from tests.readiness import START_TIMEOUT_S, answers_200, wait_until_ready


class Daemon:
    def __init__(
        self,
        cache_dir: Path,
        origins: dict[str, str],
        *extra: str,
        env: dict[str, str] | None = None,
        cache_size: str = "1GiB",
        prefix: tuple[str, ...] = (),
        listen_host: str = "127.0.0.1",
        token: str | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.listen_host = listen_host
        self.token = token  # sent by get_json, for a daemon that requires one
        self.cache_dir = cache_dir
        self.log_path = cache_dir.parent / f"daemon-{self.port}.log"
        argv = [
            *prefix,
            sys.executable,
            "-m",
            "shardcache",
            "serve",
            "--listen",
            f"{listen_host}:{self.port}",
            "--cache-dir",
            str(cache_dir),
            "--cache-size",
            cache_size,
            "--log-level",
            "debug",
            "--origin-read-timeout",
            "5",
            *extra,
        ]
        for name, url in origins.items():
            argv += ["--origin", f"{name}={url}"]
        self._has_wrapper = bool(prefix)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            self._wait_ready()
        except BaseException:
            # A daemon that did not start (its port taken meanwhile, say) leaves no process
            # and no open log behind: an unclosed file would fail some later test instead.
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._log.close()
            raise

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.listen_host in ("0.0.0.0", "::") else self.listen_host
        return f"http://{host}:{self.port}"

    def _wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once /readyz answers 200; any failed try (refused, timed out, 503) is retried
        until `timeout_s`, then this fails with the last error and the log's tail."""
        wait_until_ready(
            f"daemon on {self.url}",
            answers_200(self.url + "/readyz"),
            process=self.process,
            log=self.log_path,
            timeout_s=timeout_s,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout_s: float = 30) -> str:
        """Return the log once it contains ``text``. The access line of a request is written
        after its response has gone out, so a client can see the answer before the line."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = self.log()
            if text in log:
                return log
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the daemon's log after {timeout_s} s:\n{self.log()}")

    def metric(self, name: str, **labels: str) -> float:
        """Return the current value of one series from /metrics (0 if absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? (\S+)$", line)
            if match and match.group(1) == name:
                have = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
                if have == wanted:
                    return float(match.group(3))
        return 0.0

    def get_json(self, path: str) -> tuple[int, dict[str, object]]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def _daemon_pid(self) -> int:
        """The daemon's pid, also when it runs under a wrapper such as strace."""
        if not self._has_wrapper:
            return self.process.pid
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return int(children.split()[0])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            os.kill(self._daemon_pid(), sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode
