"""A sink that counts and drops events: for a gateway started without Kafka or an injected sink."""

from __future__ import annotations

from contracts.events import Event


class NullSink:
    def __init__(self) -> None:
        self.dropped = 0

    def emit(self, event: Event) -> None:
        self.dropped += 1

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"queued": 0, "delivered": 0, "dropped": self.dropped}
