"""An origin that says "slow down" (issue 14, throttling-aware fetching): a real HTTP origin
answering 503 SlowDown above 50 requests a second, sixteen curl loaders and prefetch on."""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request

from tests.integration.helpers import curl

KiB = 1024
LIMIT_RPS = 50


def test_an_origin_that_says_slow_down_is_obeyed(origin, start_daemon) -> None:  # type: ignore[no-untyped-def]
    shards = {f"t-{n:03d}.tar": os.urandom(32 * KiB) for n in range(64)}
    for key, data in shards.items():
        origin.put(key, data, delay_s=0.02)
    origin.slow_down_above_rps = LIMIT_RPS
    daemon = start_daemon({"o": origin.url}, "--readahead", "0")
    began = time.monotonic()
    body = json.dumps({"urls": [f"/o/{key}" for key in shards]}).encode()
    request = urllib.request.Request(daemon.url + "/_/prefetch", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202
    failures: list[str] = []

    def loader(number: int) -> None:
        for key in random.Random(number).sample(sorted(shards), 24):
            result = curl(f"{daemon.url}/o/{key}")
            if result.exit_code != 0 or result.body != shards[key]:
                failures.append(f"loader {number}: {key}: curl exit {result.exit_code}")

    loaders = [threading.Thread(target=loader, args=(n,)) for n in range(16)]
    for thread in loaders:
        thread.start()
    for thread in loaders:
        thread.join(timeout=300)
    ended = time.monotonic()

    assert failures == [], failures[:5]
    assert origin.refused_at, "the origin never throttled: the test drove too little"
    # It settles: in the second half of the run the daemon sends about what the origin takes.
    half = began + (ended - began) / 2
    late_refused = sum(1 for at in origin.refused_at if at > half)
    late_accepted = sum(1 for at in origin.accepted_at if at > half)
    assert late_refused <= 0.1 * (late_refused + late_accepted), (late_refused, late_accepted)
    assert daemon.metric("shardcache_origin_throttled_total", origin="o") >= 1
    assert "is throttling us" in daemon.log()
