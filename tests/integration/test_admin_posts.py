"""Admin posts under attack (issue 23, item 7): accepted `POST /_/plan` and `POST /_/prefetch`
bodies within the limits, many at once, must not hold the event loop (a liveness probe answers
in time) nor the memory they would take all parsed side by side; posts the queue cannot take
are refused before their bodies are parsed. Failed on 0be7475: /healthz 8.9 s, RSS 47 -> 469
MiB (422 kept), and every 429 came after parsing."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.daemon_process import Daemon
from tests.origin_server import OriginServer

POSTS = 16
KEYS = 100_000  # a 2.2 MB URL list: within MAX_EXPANSION and the body limit
# The target is 100 ms: measured 60-80 ms on a shared 2-core machine once queued
# prefetch keys were untracked by the collector and the GIL switch interval was 1 ms (150-440 ms
# before). The bound leaves room for a loaded CI machine and the test's own 32 posting threads
# (the worst of 1,636 probes took 0.76 s with the whole suite and five other runs sharing two
# cores); the failure it guards against held the loop 8.9 s.
HEALTHZ_BOUND_S = 1.0
RSS_BOUND_BYTES = 300 << 20


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _post(url: str, body: bytes, answers: list[tuple[int, dict[str, object]]]) -> None:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            answers.append((response.status, json.loads(response.read())))
    except urllib.error.HTTPError as exc:
        answers.append((exc.code, json.loads(exc.read())))


def _delete(url: str) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=30) as r:
        return int(r.status)


class _Watch:
    """Probes /healthz and samples the daemon's RSS from threads until stopped."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.slowest_s = 0.0
        self.probes = 0
        self.peak_rss = _rss_bytes(daemon.process.pid)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._probe), threading.Thread(target=self._rss)]

    def __enter__(self) -> _Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _probe(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            urllib.request.urlopen(self.daemon.url + "/healthz", timeout=60).close()
            self.slowest_s = max(self.slowest_s, time.monotonic() - began)
            self.probes += 1
            time.sleep(0.01)

    def _rss(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, _rss_bytes(self.daemon.process.pid))
            time.sleep(0.02)


def test_concurrent_plan_and_prefetch_posts_keep_the_loop_and_memory_bounded(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    rss_before = _rss_bytes(daemon.process.pid)
    plans = [  # sixteen jobs reading one dataset, as the attack posted
        json.dumps(
            {"job": f"job-{j}", "epoch": 0, "urls": [f"/web/s/{i:07d}.tar" for i in range(KEYS)]}
        ).encode()
        for j in range(POSTS)
    ]
    prefetches = [
        json.dumps({"urls": [f"/web/p{j}/{i:07d}.tar" for i in range(KEYS)]}).encode()
        for j in range(POSTS)
    ]
    plan_answers: list[tuple[int, dict[str, object]]] = []
    prefetch_answers: list[tuple[int, dict[str, object]]] = []
    posters = [
        threading.Thread(target=_post, args=(daemon.url + "/_/plan", body, plan_answers))
        for body in plans
    ] + [
        threading.Thread(target=_post, args=(daemon.url + "/_/prefetch", body, prefetch_answers))
        for body in prefetches
    ]
    with _Watch(daemon) as watch:
        for poster in posters:
            poster.start()
        for poster in posters:
            poster.join(180)
        rss_after = _rss_bytes(daemon.process.pid)
    print(
        f"/healthz worst {watch.slowest_s * 1000:.0f} ms over {watch.probes} probes; RSS "
        f"{rss_before >> 20} MiB before, {watch.peak_rss >> 20} MiB peak, {rss_after >> 20} after"
    )
    assert len(plan_answers) == len(prefetch_answers) == POSTS
    assert all(status in (200, 429) for status, _ in plan_answers), plan_answers
    assert all(status in (202, 429) for status, _ in prefetch_answers), prefetch_answers
    accepted_plans = [answer for status, answer in plan_answers if status == 200]
    accepted_prefetches = [answer for status, answer in prefetch_answers if status == 202]
    # MAX_PLANNED_KEYS: ten plans of 100,000 fit; MAX_PENDING: two prefetch posts of 100,000.
    # On a loaded machine a post may also wait for its turn longer than the body timeout: it
    # is then refused unread too (bounded wait), and fewer than the room allows are accepted.
    waited = [
        answer
        for status, answer in plan_answers + prefetch_answers
        if status == 429 and "took more than" in str(answer["error"])
    ]
    print(
        f"accepted {len(accepted_plans)} plans, {len(accepted_prefetches)} prefetch posts; "
        f"{len(waited)} refused after waiting their turn"
    )
    # Some post is always served; a kind whose posts all waited past the body timeout (the
    # sixteen plans took the turns first, on a loaded machine) may have none accepted.
    assert len(accepted_plans) <= 10 and len(accepted_prefetches) <= 2
    assert accepted_plans or accepted_prefetches
    if not accepted_prefetches:
        assert any("took more than" in str(a["error"]) for s, a in prefetch_answers if s == 429)
    if not waited:
        assert (len(accepted_plans), len(accepted_prefetches)) == (10, 2)
    assert watch.slowest_s < HEALTHZ_BOUND_S, f"/healthz took {watch.slowest_s:.2f} s"
    assert watch.peak_rss < RSS_BOUND_BYTES, f"RSS peaked at {watch.peak_rss >> 20} MiB"
    # The queue was full: the other posts were refused without their bodies being parsed.
    refused = [answer for status, answer in prefetch_answers if status == 429]
    assert all(
        "not parsed" in str(answer["error"]) or "not read" in str(answer["error"])
        for answer in refused
    ), refused
    assert daemon.get_json("/healthz")[0] == 200
    assert _delete(daemon.url + "/_/prefetch") == 200  # 200,000 keys the origin lacks
