"""Events reach the durable spool without waiting on Kafka: a SIGKILL during an outage loses ~100 ms at most.

Real processes throughout: a private broker (SIGKILLed, later restarted), ``python -m gateway``
with the Kafka sink and a spool directory that outlives it, the simulator upstream, and HTTP
traffic at 80 requests/s on 127.0.0.1. Every answered request's event must reach Kafka once
the broker is back, except events answered within ``LOSS_BOUND_S`` before a kill.
"""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from contracts.events import Event, InteractionEvent
from gateway.kafka_sink import KafkaSink, SinkConfig, Topics, ensure_topics
from tests.gateway.conftest import ADMIN_TOKEN, free_port, get, http
from tests.gateway.kafka_helpers import (
    ROOT,
    PrivateBroker,
    check_complete_and_ordered,
    consume,
    consume_all,
    event,
    wait_until,
)

LOSS_BOUND_S = 0.1
SPOOL_BOUND_S = 0.1
FAST = SinkConfig(flush_timeout_s=2.0, probe_timeout_s=1.0, backoff_initial_s=0.1, backoff_max_s=1.0)
RATE = 80.0
KILLS = 4


class GatewayProcess:
    """``python -m gateway`` as a child process; restartable with the same settings."""

    def __init__(self, env: dict[str, str], port: int, log: IO[bytes]) -> None:
        self.env, self.port, self.log = env, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "gateway"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}")
            try:
                if get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("gateway did not start within 60 s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()

    def sink(self) -> dict[str, Any]:
        body: dict[str, Any] = get(self.url + "/readyz", timeout=5).json()["sink"]
        return body


class Traffic:
    """Chat requests at ``rate`` per second from a few keep-alive connections.

    Records each answered request's id and when its answer was complete; connection errors
    (the gateway being killed or restarting) are counted and the pacing continues.
    """

    def __init__(
        self, url: str, route: str, key: str, rate: float, threads: int = 4, limit_s: float = 300
    ) -> None:
        self.port = int(url.rsplit(":", 1)[1])
        self.headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
        self.route, self.interval = route, threads / rate
        self.answered: list[tuple[str, float]] = []
        self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + limit_s
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def count(self) -> int:
        with self._lock:
            return len(self.answered)

    def _run(self, worker: int) -> None:
        conn: httpclient.HTTPConnection | None = None
        next_at = time.monotonic() + worker * self.interval / len(self._threads)
        i = 0
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            next_at = max(next_at + self.interval, time.monotonic() - 1.0)  # no burst after a restart
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                break
            i += 1
            body = json.dumps(
                {
                    "model": self.route,
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "user": f"user-{worker}-{i % 25}",
                }
            )
            try:
                if conn is None:
                    conn = httpclient.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/v1/chat/completions", body, self.headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    with self._lock:
                        self.answered.append((resp.getheader("x-request-id") or "", time.monotonic()))
                    continue
            except (OSError, httpclient.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
            with self._lock:
                self.failures += 1
        if conn is not None:
            conn.close()


def _producer_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("kafka-python-producer"))


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass  # the gateway is (re)starting
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _configure(url: str, simulator: str, route: str) -> str:
    """An upstream, a running A/B experiment on ``route`` and a client key; returns the key."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    r = http("POST", url + "/admin/api-keys", {"name": f"key-{route}"}, headers=auth)
    assert r.status_code == 201, r.text
    key = str(r.json()["key"])
    upstream = {"name": f"up-{route}", "base_url": simulator}
    assert http("POST", url + "/admin/upstreams", upstream, headers=auth).status_code == 201
    experiment = {
        "name": route,
        "route": route,
        "mode": "ab",
        "variants": [
            {"name": "control", "upstream": f"up-{route}", "model": "base", "weight": 50, "is_control": True},
            {"name": "cand", "upstream": f"up-{route}", "model": "cand", "weight": 50},
        ],
    }
    r = http("POST", url + "/admin/experiments", experiment, headers=auth)
    assert r.status_code == 201, r.text
    r = http("POST", url + f"/admin/experiments/{r.json()['id']}/start", headers=auth)
    assert r.status_code in (200, 201), r.text
    return key


@pytest.mark.slow
def test_a_gateway_sigkilled_during_a_broker_outage_loses_at_most_100_ms_of_events_per_kill(
    module_database_url: str,
    simulator: str,
    unique_name: str,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    rng = random.Random(2024)
    route = f"dur-{unique_name}"[:60]
    broker = PrivateBroker(tmp_path / "state")
    broker.up()
    log = (tmp_path / "gateway.log").open("ab")
    env = {
        **os.environ,
        "LIFTGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "LIFTGATE_DATABASE_URL": module_database_url,
        "LIFTGATE_KAFKA_BOOTSTRAP": broker.bootstrap,
        "LIFTGATE_SPOOL_DIR": str(tmp_path / "spool"),
        "LIFTGATE_PORT": str(free_port()),
        "LIFTGATE_REFRESH_INTERVAL_S": "0.2",
    }
    gateway = GatewayProcess(env, int(env["LIFTGATE_PORT"]), log)
    kills: list[float] = []
    try:
        gateway.start()
        key = _configure(gateway.url, simulator, route)
        with Traffic(gateway.url, route, key, RATE) as traffic:
            _wait(lambda: traffic.count() > 100 and gateway.sink()["delivered"] > 50, 60, "live delivery")
            broker.kill()
            for _ in range(KILLS):
                time.sleep(rng.uniform(1.0, 3.0))  # under load, at a random moment
                kills.append(time.monotonic())
                gateway.kill()
                gateway.start()  # the restarted gateway spools into the same directory
            time.sleep(1.0)
            broker.up()
            back = time.monotonic()
            _wait(lambda: gateway.sink()["live"] == 1, 60, "the sink live again")
            record_property("gateway_resume_s", round(time.monotonic() - back, 2))
            time.sleep(1.0)
        _wait(
            lambda: (s := gateway.sink())["spool_pending"] == 0 and s["queued"] == 0, 60, "the spool drained"
        )
        # The last gateway read what it and the killed ones spooled back from disk.
        replayed = gateway.sink()["replayed"]
        answered = dict(traffic.answered)
        received = consume_all(broker.bootstrap, [Topics().interactions])
    finally:
        gateway.stop()
        log.close()
        broker.down()
    events = [e for e in received if isinstance(e, InteractionEvent) and e.route == route]
    unique = {e.event_id: e for e in events}
    by_request: dict[str, set[str]] = {}
    for e in unique.values():
        by_request.setdefault(e.request_id, set()).add(e.event_id)
    assert all(len(ids) == 1 for ids in by_request.values()), "a request was recorded twice"
    lost = {rid: t for rid, t in answered.items() if rid not in by_request}
    ages = []
    for rid, t in lost.items():
        killed_at = next((k for k in kills if k >= t), None)
        assert killed_at is not None, f"{rid}, answered after the last kill, never reached Kafka"
        ages.append(killed_at - t)
    per_kill = [sum(1 for t in lost.values() if k - LOSS_BOUND_S * 10 < t <= k) for k in kills]
    record_property("answered", len(answered))
    record_property("lost_per_kill", per_kill)
    record_property("oldest_lost_ms", round(max(ages, default=0.0) * 1000, 1))
    record_property("duplicates_in_kafka", len(events) - len(unique))
    assert max(ages, default=0.0) <= LOSS_BOUND_S, (
        f"{len(lost)} of {len(answered)} answered events lost over {len(kills)} kills "
        f"(per kill {per_kill}); oldest answered {max(ages):.3f}s before its kill"
    )
    assert len(answered) > RATE * 8 and traffic.failures < len(answered)
    spooled_by_killed = [
        r for r, t in answered.items() if kills[0] - 1.0 < t < kills[-1] - 1.0 and r not in lost
    ]
    assert replayed >= len(spooled_by_killed) > 0


@pytest.mark.slow
async def test_events_reach_the_spool_within_100_ms_while_delivery_hangs_on_a_frozen_broker(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    broker = PrivateBroker(tmp_path / "state")
    broker.up()
    try:
        topics = Topics()
        ensure_topics(broker.bootstrap, 6, topics)
        sink = KafkaSink(broker.bootstrap, tmp_path / "spool", topics=topics, config=FAST)
        await sink.start()
        await wait_until(lambda: sink.live, 30, "connected")
        broker.freeze()
        sent: list[Event] = []
        lags: list[float] = []
        until = time.monotonic() + 2 * FAST.flush_timeout_s  # a blocked flush, then blocked probes
        while time.monotonic() < until:
            burst = [event(len(sent) + k) for k in range(5)]
            for ev in burst:
                sink.emit(ev)
            sent += burst
            emitted = time.monotonic()
            for _ in range(2_000):  # up to ~10 s
                if sink.stats()["spooled"] == len(sent):
                    break
                await asyncio.sleep(0.005)
            lags.append(time.monotonic() - emitted)
            await asyncio.sleep(0.01)
        assert not sink.live and sink.stats()["send_failures"] >= 1  # delivery did hang meanwhile
        record_property("spool_lag_ms_max", round(max(lags) * 1000, 1))
        assert max(lags) <= SPOOL_BOUND_S, f"an event waited {max(lags) * 1000:.0f} ms for the spool"
        broker.thaw()
        await wait_until(
            lambda: sink.live and sink.stats()["spool_pending"] == 0, 60, "delivery after the thaw"
        )
        # The producer given up on during the freeze is closed once its requests end: no thread leak.
        await wait_until(lambda: _producer_threads() == 1, 30, "the abandoned producer closed")
        await sink.close()
        check_complete_and_ordered(
            consume(broker.bootstrap, [topics.interactions], len(sent)), sent, len(sent)
        )
    finally:
        broker.thaw()
        broker.down()
