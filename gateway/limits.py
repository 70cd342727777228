"""Per-client limits: completion requests in flight, and feedback calls per second.

A client is its API key (SHA-256, when ``LIFTGATE_CLIENT_KEYS=required``) or else its IP
address — the one identity it cannot choose freely (a unit id or ``user`` field can be
rotated at will). Behind a proxy every client shares the proxy's address: require keys, or
raise the limits. State is per worker process and bounded: idle clients are forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ConcurrencyLimit:
    """At most ``limit`` requests in flight per client (``limit`` 0: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight: dict[str, int] = {}  # only clients with a request in flight

    def acquire(self, client: str) -> bool:
        if not self.limit:
            return True
        n = self.in_flight.get(client, 0)
        if n >= self.limit:
            return False
        self.in_flight[client] = n + 1
        return True

    def release(self, client: str) -> None:
        if not self.limit:
            return
        n = self.in_flight[client] - 1
        if n:
            self.in_flight[client] = n
        else:
            del self.in_flight[client]


class RateLimit:
    """A token bucket per client: ``rate`` calls per second, bursts of ``burst`` (``rate`` 0: no limit)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = 100_000,
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self.max_clients = max_clients
        self.buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, as of)

    def take(self, client: str) -> float:
        """0.0 when the call may go ahead, else the seconds until it could."""
        if not self.rate:
            return 0.0
        now = self.clock()
        found = self.buckets.get(client)
        tokens = self.burst if found is None else min(self.burst, found[0] + (now - found[1]) * self.rate)
        if tokens >= 1.0:
            self.buckets[client] = (tokens - 1.0, now)
            if found is None and len(self.buckets) > self.max_clients:
                self._forget_idle(now)
            return 0.0
        self.buckets[client] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        """Drop buckets that have refilled (a forgotten client starts full: the same thing);
        if that is not enough, the oldest half — memory stays bounded under any churn."""
        full = [c for c, (t, at) in self.buckets.items() if t + (now - at) * self.rate >= self.burst]
        for c in full:
            del self.buckets[c]
        if len(self.buckets) > self.max_clients:
            for c in list(self.buckets)[: len(self.buckets) - self.max_clients // 2]:
                del self.buckets[c]
