"""The suite's wait for a started process (tests/readiness.py, Daemon._wait_ready): a try that
times out is one failed try, retried, and a deadline that passes fails with the last error and
the process's log."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.readiness import answers_200, wait_until_ready


class SilentFirst:
    """A loopback server that accepts its first `silent` connections and never answers them
    (a daemon too busy to answer /readyz in time), then answers every request 200."""

    def __init__(self, silent: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._silent = silent
        self._held: list[socket.socket] = []
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed by close()
                return
            self.accepted += 1
            if self.accepted <= self._silent:
                self._held.append(connection)
                continue
            with connection:
                connection.recv(65536)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                )

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() the thread is blocked in
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for connection in self._held:
            connection.close()
        self._thread.join(10)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that stays up, standing for the daemon whose readiness is asked."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


def test_the_daemon_wait_survives_a_try_that_times_out(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """The first /readyz is accepted and never answered: urllib raises TimeoutError (not a
    URLError), which the wait retried on no earlier commit; the second try answers."""
    server = SilentFirst(silent=1)
    try:
        daemon = object.__new__(Daemon)  # the wait alone, on a process that stands for it
        daemon.port, daemon.listen_host, daemon.process = server.port, "127.0.0.1", sleeper
        daemon.log_path = tmp_path / "daemon.log"
        daemon._wait_ready()
        assert server.accepted == 2
    finally:
        server.close()


def test_a_deadline_that_passes_names_the_last_error_and_the_log(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    server = SilentFirst(silent=1000)
    log = tmp_path / "process.log"
    log.write_text("first line\nthe last thing it said\n")
    try:
        with pytest.raises(AssertionError) as failure:
            wait_until_ready(
                "the silent server",
                answers_200(f"http://127.0.0.1:{server.port}/", try_timeout_s=0.2),
                process=sleeper,
                log=log,
                timeout_s=1,
            )
    finally:
        server.close()
    message = str(failure.value)
    assert "the silent server not ready after 1 s" in message
    assert "TimeoutError" in message and "the last thing it said" in message


def test_a_process_that_exits_fails_at_once_with_its_code_and_log(tmp_path: Path) -> None:
    log = tmp_path / "process.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", "print('cannot listen'); raise SystemExit(2)"],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        process.wait(60)
    with pytest.raises(AssertionError, match=r"(?s)exited 2 before it was ready.*cannot listen"):
        wait_until_ready("it", lambda: False, process=process, log=log, timeout_s=60)
