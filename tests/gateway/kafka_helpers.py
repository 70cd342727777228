"""Helpers for the Kafka sink tests: a private broker, a reader, and events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil
from kafka import KafkaConsumer, TopicPartition

from contracts.events import Event, InteractionEvent, decode

ROOT = Path(__file__).resolve().parents[2]


def event(i: int, units: int = 20) -> InteractionEvent:
    return InteractionEvent(
        request_id=f"req-{i}",
        route="assistant",
        unit_id=f"unit-{i % units}",
        unit_source="header",
        role="primary",
        mode="ab",
        endpoint="chat",
        model="m",
        upstream="sim",
        status="ok",
        http_status=200,
        latency_ms=float(i),
        experiment_id=1,
        variant="candidate" if i % 2 else "control",
    )


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port_pair() -> int:
    """A port P with P and P + 1 free (the broker's controller listens on P + 1).

    Chosen below the kernel's ephemeral range: a port the kernel hands out (bind to 0) may be
    taken as the local end of any outgoing connection between this check and the broker's own
    bind, or while a test has the broker down for a restart on the same port.
    """
    low, _ = _ephemeral_ports()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low - 1)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair found")


_MARKER = "lg-private-broker-"


def stop_orphaned_private_brokers() -> None:
    """Stop brokers a killed earlier run of these tests left behind (their pytest pid is gone)."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        match = re.search(_MARKER + r"(\d+)", cmd)
        if match and "kafka.Kafka" in cmd and not psutil.pid_exists(int(match.group(1))):
            with contextlib.suppress(psutil.Error):
                proc.terminate()
                try:
                    proc.wait(30)
                except psutil.TimeoutExpired:
                    proc.kill()


class PrivateBroker:
    """A real Kafka broker of our own (own port, own state dir), started with scripts/kafka.py."""

    def __init__(self, base_dir: Path) -> None:
        # The marker and our pid in the path let a later run find the broker if we get killed.
        state_dir = base_dir / f"{_MARKER}{os.getpid()}"
        self.state_dir = state_dir
        self.port = free_port_pair()
        self.bootstrap = f"127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "LIFTGATE_KAFKA_BOOTSTRAP"}
        env["LIFTGATE_STATE_DIR"] = str(state_dir)
        shared_state = Path(os.environ.get("LIFTGATE_STATE_DIR") or ROOT / ".liftgate")
        libs = sorted((shared_state / "kafka").glob("libs-*"))
        if libs and "LIFTGATE_KAFKA_LIBS" not in env:
            env["LIFTGATE_KAFKA_LIBS"] = str(libs[-1])  # reuse the fetched jars
        self._env = env

    def _script(self, *args: str) -> None:
        cmd = [sys.executable, str(ROOT / "scripts" / "kafka.py"), *args]
        res = subprocess.run(cmd, env=self._env, capture_output=True, text=True, timeout=180, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"scripts/kafka.py {args} failed: {res.stdout}\n{res.stderr}")

    def up(self) -> None:
        stop_orphaned_private_brokers()
        self._script("up", "--port", str(self.port))

    def down(self) -> None:
        self._script("down")

    def _process(self) -> psutil.Process:
        return psutil.Process(int((self.state_dir / "kafka" / "broker.pid").read_text().strip()))

    def kill(self) -> None:
        """SIGKILL the broker (a crash, not a shutdown) and wait until it is gone."""
        proc = self._process()
        proc.kill()
        proc.wait(30)

    def freeze(self) -> None:
        """SIGSTOP the broker: its connections stay open and nothing is answered (a hung broker)."""
        self._process().suspend()

    def thaw(self) -> None:
        with contextlib.suppress(psutil.Error, FileNotFoundError):
            self._process().resume()


def consume(bootstrap: str, topics: Iterable[str], expected: int, timeout_s: float = 60.0) -> list[Event]:
    """Read every message of ``topics`` from the start until ``expected`` arrived (or time out)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", group_id=None
    )
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out: list[Event] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500, max_records=10_000).values():
                for message in batch:
                    ev = decode(message.value)
                    assert message.key == ev.unit_id.encode()
                    out.append(ev)
        # Anything beyond `expected` (duplicates) is read too, briefly.
        for batch in consumer.poll(timeout_ms=300).values():
            out.extend(decode(m.value) for m in batch)
        return out
    finally:
        consumer.close()


def consume_all(bootstrap: str, topics: Iterable[str], timeout_s: float = 60.0) -> list[Event]:
    """Every message of ``topics``, from the start to the end offsets they have now."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", group_id=None
    )
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out: list[Event] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, f"could not read {topics} to their end in {timeout_s}s"
            for batch in consumer.poll(timeout_ms=500, max_records=10_000).values():
                out.extend(decode(m.value) for m in batch)
        return out
    finally:
        consumer.close()


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll a real condition (the sink works in its own thread) until a deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def dead_bootstrap() -> str:
    """An address where no broker listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def check_complete_and_ordered(
    events: Sequence[Event], expected: Sequence[Event], max_duplicates: int
) -> None:
    """Every expected event_id exactly once after dedup; each unit's events in emit order."""
    seen: dict[str, Event] = {}
    for ev in events:
        seen.setdefault(ev.event_id, ev)
    assert len(events) - len(seen) <= max_duplicates, f"{len(events) - len(seen)} duplicates"
    assert set(seen) == {e.event_id for e in expected}
    position = {e.event_id: i for i, e in enumerate(expected)}
    last: dict[str, int] = {}
    for ev in seen.values():
        # dict keeps first-arrival order; per unit it must follow emit order
        key = f"{ev.type}:{ev.unit_id}"
        assert position[ev.event_id] > last.get(key, -1), f"unit {ev.unit_id} out of order"
        last[key] = position[ev.event_id]
