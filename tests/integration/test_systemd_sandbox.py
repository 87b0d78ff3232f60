"""The systemd unit's sandbox (deploy/systemd/shardcache.service): `systemd-analyze security`
rates it under 3 (it was 5.8 MEDIUM), and the daemon needs nothing the sandbox takes away.

systemd cannot run the unit here (no systemd as PID 1, so no `systemd-run` either), so the
second test does what the sandbox would refuse and watches for it: the daemon runs under
`strace -f` through a miss received by receiver processes, a hit (sendfile), a range, a HEAD, a
reload and a stop, and every system call, socket family, executable mapping and file written is
checked against what the unit allows (its SystemCallFilter lines expanded by systemd-analyze).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "shardcache.service"
MiB = 1024 * 1024


def _analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is required (Debian's systemd package)"
    return analyze


def test_systemd_analyze_security_rates_the_unit_under_3() -> None:
    result = subprocess.run(
        [_analyze(), "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", output)
    assert level, output
    assert float(level[1]) < 3.0, output


def _directives(name: str) -> list[str]:
    return re.findall(rf"^{name}=(.*)$", UNIT.read_text(), re.MULTILINE)


@functools.cache
def _group(name: str) -> frozenset[str]:
    """The system calls of a systemd syscall group (`@system-service`), nested groups expanded."""
    listing = subprocess.run(
        [_analyze(), "syscall-filter", "--no-pager", name],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    calls: set[str] = set()
    for line in listing.splitlines()[1:]:
        item = line.strip()
        if item and not item.startswith("#"):
            calls |= _group(item) if item.startswith("@") else {item}
    return frozenset(calls)


def _allowed_calls() -> set[str]:
    """The unit's SystemCallFilter lines, in order: the first an allow list, `~` lines taking
    away, later plain lines adding back (systemd.exec(5))."""
    allowed: set[str] = set()
    for line in _directives("SystemCallFilter"):
        deny = line.startswith("~")
        names = line.removeprefix("~").split()
        calls = set().union(*(_group(n) if n.startswith("@") else {n} for n in names))
        allowed = allowed - calls if deny else allowed | calls
    assert allowed, "the unit has no SystemCallFilter allow list"
    return allowed


def test_the_daemon_needs_nothing_the_units_sandbox_refuses(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    strace = shutil.which("strace")
    assert strace, "strace is required (apt-get install strace)"
    data = os.urandom(8 * MiB)
    origin.put("s.tar", data)
    trace = tmp_path / "trace.txt"
    daemon: Daemon = start_daemon(
        {"web": origin.url},
        "--receivers",
        "2",
        prefix=(strace, "-f", "-qq", "-e", "signal=none", "-o", str(trace)),
    )
    receivers = lambda: daemon.get_json("/_/status")[1]["receivers"]  # noqa: E731
    wait_for("two receivers", lambda: receivers()["alive"] == 2)  # type: ignore[index]
    miss = curl(f"{daemon.url}/web/s.tar")
    hit = curl(f"{daemon.url}/web/s.tar")
    ranged = curl(f"{daemon.url}/web/s.tar", "-r", "1000-1999")
    assert miss.headers["x-shardcache"] == "miss" and hit.headers["x-shardcache"] == "hit"
    assert miss.sha256 == hit.sha256 == sha256(data) and ranged.body == data[1000:2000]
    assert curl(f"{daemon.url}/web/s.tar", "-I").status == 200
    os.kill(daemon._daemon_pid(), signal.SIGHUP)
    wait_for("the reload", lambda: "reloaded" in daemon.log())
    assert daemon.stop() == 0
    text = trace.read_text()

    called = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)(?:\(| resumed>)", text, re.M))
    assert {"sendfile", "splice", "clone", "socketpair"} & called, "the trace saw no body"
    assert "sendfile" in called  # the hit
    # SQLite fchowns the files it creates only when it runs as root (its unix VFS asks
    # geteuid() first); the unit's DynamicUser never is, and a refusal would be ignored.
    as_root = {"fchown"} if os.geteuid() == 0 else set()
    refused = sorted(called - _allowed_calls() - as_root)
    assert refused == [], f"calls the unit's SystemCallFilter refuses: {refused}"

    families = set(re.findall(r"\bsocket(?:pair)?\((AF_[A-Z0-9]+)", text))
    allowed_families = set(_directives("RestrictAddressFamilies")[0].split())
    assert families <= allowed_families, families - allowed_families

    # MemoryDenyWriteExecute: no mapping both writable and executable, none made executable.
    if "MemoryDenyWriteExecute=yes" in UNIT.read_text():
        mapping = (
            r"^.*\b(?:mprotect\(.*PROT_EXEC|mmap\(.*PROT_WRITE\|PROT_EXEC"
            r"|mmap\(NULL, .*PROT_EXEC.*MAP_ANONYMOUS).*$"
        )
        assert re.findall(mapping, text, re.M) == [], re.findall(mapping, text, re.M)[:5]

    # ProtectSystem=strict: files opened for writing lie in the cache dir (ReadWritePaths), the
    # private /tmp, or are devices PrivateDevices keeps (/dev/null).
    writable = ("/dev/null", "/tmp/", str(daemon.cache_dir) + "/", str(daemon.cache_dir))
    written = {
        path
        for path, flags in re.findall(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]+)", ([A-Z_|]+)', text)
        if re.search(r"O_WRONLY|O_RDWR|O_CREAT", flags)
    }
    assert all(p.startswith(writable) or p == str(daemon.cache_dir) for p in written), written
