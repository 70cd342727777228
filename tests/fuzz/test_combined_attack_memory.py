"""Both services' memory under every kind of abusive client at once: oversized bodies
(declared and chunked, with and without credentials), slow clients (slowloris header
streams and trickled bodies) and a shadow flood (1 MiB requests mirrored to a candidate
that never answers), against real processes (``python -m gateway`` in front of the real
simulator, ``python -m analytics``), while a well-behaved client keeps being served.

The gateway's own tests show each attack alone on the gateway (``test_body_limits``,
``test_shadow_memory``); this one adds the analytics service and the attacks combined,
which is what an attacker would do. Bounds (peak RSS growth over the attack): gateway
< 96 MiB (the shadow byte budget of 16 MiB, 4 keyed 1 MiB requests in flight with their
copies, allocator slack; the attacks send > 1.5 GiB), analytics < 32 MiB (its 1 MiB body
limit; it is sent 800 MiB).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import MiB
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.fuzz.services import Service, analytics, gateway, http_json
from tests.gateway.conftest import PeakRss
from tests.gateway.test_body_limits import upload
from tests.known_secrets import secret

ADMIN = secret("mem-admin")
READ = secret("mem-read")
GATEWAY_BOUND = 96 * MiB
ANALYTICS_BOUND = 32 * MiB
#: A well-behaved request answered later than this during the attack counts as starved.
SERVED_WITHIN_S = 10.0
SLOW_CLIENTS = 25  # of each kind, per service


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    fast: dict[str, Any] = {"latency_ms": 2.0, "latency_sd": 0.5, "ttft_ms": 1.0, "ttft_sd": 0.2,
                            "tokens": 8.0, "tokens_sd": 2.0}  # fmt: skip
    models = [SimulatorModel("base", **fast), SimulatorModel("hanger", hang=True, hang_s=120.0)]
    with SimulatorProcess(models) as sim:
        yield sim.url + "/v1"


@dataclass
class Trickler:
    """Slow clients on one thread: each socket gets one byte every ``every_s`` (a header line
    that never ends, or a body far shorter than its Content-Length) until the server closes it."""

    port: int
    heads: list[bytes]
    every_s: float = 0.5
    deadline_s: float = 40.0
    closed_after_s: list[float] = field(default_factory=list)
    still_open: int = 0

    def run(self) -> None:
        t0 = time.monotonic()
        sockets = []
        for head in self.heads:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(head)
            sockets.append(s)
        open_ = set(sockets)
        try:
            while open_ and time.monotonic() - t0 < self.deadline_s:
                readable, _, _ = select.select(list(open_), [], [], self.every_s)
                for s in readable:  # an answer (408/400) or a close: the server let go
                    try:
                        while s.recv(65536):
                            pass
                    except OSError:
                        pass
                    self.closed_after_s.append(time.monotonic() - t0)
                    open_.discard(s)
                for s in list(open_):
                    try:
                        s.send(b"a")
                    except OSError:
                        self.closed_after_s.append(time.monotonic() - t0)
                        open_.discard(s)
        finally:
            self.still_open = len(open_)
            for s in sockets:
                s.close()


def _slow_heads(path: str, headers: str) -> list[bytes]:
    loris = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode()
    body = f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{".encode()
    return [loris] * SLOW_CLIENTS + [body] * SLOW_CLIENTS


def _setup_gateway(url: str, simulator: str) -> str:
    """A shadow route mirroring to a candidate that never answers; returns a client key."""

    def admin(method: str, path: str, body: object = None) -> Any:
        status, data = http_json(method, url + path, ADMIN, body)
        assert status < 300, (path, status, data)
        return data

    admin("POST", "/admin/upstreams", {"name": "sim", "base_url": simulator})
    admin("POST", "/admin/upstreams", {"name": "sim-hang", "base_url": simulator, "timeout_s": 120})
    admin("POST", "/admin/experiments", {"name": "flood", "route": "flood", "mode": "shadow", "variants": [
        {"name": "control", "upstream": "sim", "model": "base", "weight": 1, "is_control": True},
        {"name": "hang", "upstream": "sim-hang", "model": "hanger", "weight": 0}]})  # fmt: skip
    admin("POST", "/admin/experiments/flood/start")
    key = str(admin("POST", "/admin/api-keys", {"name": "mem"})["key"])
    deadline = time.monotonic() + 10
    chat = {"model": "flood", "messages": [{"role": "user", "content": "warm up"}]}
    while http_json("POST", url + "/v1/chat/completions", key, chat)[0] != 200:
        assert time.monotonic() < deadline, "the route never became ready"
        time.sleep(0.05)
    return key


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # a few minutes in CI; more on a busy machine
def test_both_services_stay_small_and_serving_under_oversized_slow_and_flooding_clients_at_once(
    module_database_url: str, simulator: str, tmp_path: Path
) -> None:
    timeouts = {"LIFTGATE_HEADER_TIMEOUT_S": "2", "LIFTGATE_BODY_TIMEOUT_S": "3"}
    with (
        gateway(
            module_database_url, ADMIN, tmp_path / "gateway.log",
            LIFTGATE_CLIENT_KEYS="required", LIFTGATE_SPOOL_DIR=str(tmp_path / "spool"),
            LIFTGATE_SHADOW_QUEUE_BYTES=str(16 * MiB), LIFTGATE_REFRESH_INTERVAL_S="0.2", **timeouts,
        ) as gw,
        analytics(
            module_database_url, ADMIN, READ, tmp_path / "analytics.log",
            LIFTGATE_SNAPSHOT_INTERVAL_S="0", LIFTGATE_ROLLOUT_CONTROLLER="false", **timeouts,
        ) as an,
    ):  # fmt: skip
        key = _setup_gateway(gw.url, simulator)
        keyed, admin = f"Authorization: Bearer {key}\r\n", f"Authorization: Bearer {ADMIN}\r\n"
        answers: dict[str, list[bytes]] = {"gateway": [], "analytics": []}
        oversized = [
            (gw, "/v1/feedback", 300 * MiB, True, keyed),
            (gw, "/v1/feedback", 300 * MiB, False, keyed),
            *[(gw, "/v1/chat/completions", 64 * MiB, chunked, "") for chunked in (True, False, True, False)],
            *[(gw, "/v1/chat/completions", 64 * MiB, chunked, keyed) for chunked in (True, False)],
            *[
                (an, "/api/metrics", 200 * MiB, chunked, who)
                for chunked in (True, False)
                for who in ("", admin)
            ],
        ]
        slow = [
            Trickler(gw.port, _slow_heads("/v1/chat/completions", keyed)),
            Trickler(an.port, _slow_heads("/api/metrics", admin)),
        ]
        flood_statuses: list[int] = []
        served: list[tuple[str, int, float]] = []
        stop = threading.Event()

        def oversize(service: Service, path: str, size: int, chunked: bool, headers: str) -> None:
            name = "gateway" if service is gw else "analytics"
            answers[name].append(upload(service.port, path, size, chunked=chunked, headers=headers))

        def flood(k: int) -> None:
            content = "m" * MiB
            for i in range(30):
                msg = {
                    "model": "flood",
                    "messages": [{"role": "user", "content": content}],
                    "user": f"c{k}-{i}",
                }
                flood_statuses.append(http_json("POST", gw.url + "/v1/chat/completions", key, msg)[0])

        def well_behaved() -> None:
            chat = {"model": "flood", "messages": [{"role": "user", "content": "still there?"}]}
            while not stop.is_set():
                for name, call in (
                    ("gateway", lambda: http_json("POST", gw.url + "/v1/chat/completions", key, chat)),
                    ("analytics", lambda: http_json("GET", an.url + "/api/experiments", READ)),
                ):
                    t0 = time.monotonic()
                    try:
                        status = call()[0]
                    except OSError:
                        status = -1
                    served.append((name, status, time.monotonic() - t0))
                stop.wait(0.2)

        gw_base, an_base = gw.rss(), an.rss()
        with PeakRss(gw) as gw_peak, PeakRss(an) as an_peak:
            threads = [threading.Thread(target=oversize, args=job) for job in oversized]
            threads += [threading.Thread(target=t.run) for t in slow]
            threads += [threading.Thread(target=flood, args=(k,)) for k in range(4)]
            observer = threading.Thread(target=well_behaved)
            observer.start()
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            stop.set()
            observer.join(timeout=30)
        assert not any(t.is_alive() for t in [*threads, observer]), "an attacking client never finished"

        gw_growth, an_growth = gw_peak.peak - gw_base, an_peak.peak - an_base
        figures = (
            f"gateway grew {gw_growth / MiB:.1f} MiB (bound {GATEWAY_BOUND // MiB}),"
            f" analytics {an_growth / MiB:.1f} MiB (bound {ANALYTICS_BOUND // MiB});"
            f" {len(served)} well-behaved requests, slowest {max(s[2] for s in served):.2f} s"
        )
        print(figures)
        assert gw_growth < GATEWAY_BOUND, figures
        assert an_growth < ANALYTICS_BOUND, figures
        # Every attack was refused for what it is, the flood itself served.
        gw_codes = sorted(a[9:12].decode() for a in answers["gateway"])
        an_codes = sorted(a[9:12].decode() for a in answers["analytics"])
        assert gw_codes == ["401"] * 4 + ["413"] * 4, gw_codes
        assert set(an_codes) <= {"401", "413"} and an_codes.count("413") >= 2, an_codes
        assert flood_statuses == [200] * 120, sorted(set(flood_statuses))
        # The slow clients were let go by the servers' deadlines (2 s + 3 s, with slack).
        for trickler in slow:
            assert trickler.still_open == 0 and len(trickler.closed_after_s) == 2 * SLOW_CLIENTS
            assert max(trickler.closed_after_s) < 15, max(trickler.closed_after_s)
        # And throughout, the well-behaved client was served, promptly.
        assert {name for name, _, _ in served} == {"gateway", "analytics"}
        assert all(status == 200 for _, status, _ in served), [s for s in served if s[1] != 200][:5]
        assert max(elapsed for _, _, elapsed in served) < SERVED_WITHIN_S, figures
        assert gw.alive() and an.alive()
