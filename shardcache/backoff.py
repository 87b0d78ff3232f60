"""`doubling_s`: the one back-off schedule, base, 2·base, 4·base… up to a cap. A fill's retries
(`fetch.policy`) and a failing upstream's breaker (`cluster.breaker`) both wait by it."""

from __future__ import annotations


def doubling_s(attempt: int, base_s: float, cap_s: float) -> float:
    """The wait before try `attempt` + 1 (attempt 1: `base_s`), at most `cap_s`."""
    return float(min(cap_s, base_s * 2 ** (max(1, attempt) - 1)))


__all__ = ["doubling_s"]
