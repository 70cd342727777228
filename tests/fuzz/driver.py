"""Send generated cases to a live service, many at a time, and keep the score.

A fuzz run is a list of :class:`Shard` — one operation, one generation mode (schemathesis'
positive or negative data), a number of examples, optionally path parameters pinned to a
resource that exists — split over a few worker processes. Each worker draws its shards'
cases with Hypothesis (seeded per shard from the run's seed, so the cases do not depend on
how shards are split or scheduled) and sends each one while the next is drawn, a bounded
number in flight, each with a deadline. A case fails when the service answers ≥ 500, does
not answer within the deadline (a hang), or drops the connection without an answer.

Generation is what costs (a few ms of CPU per case, against well under 1 ms to serve most
of them), hence the processes: the machine's cores draw cases while the service answers.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import http.client
import multiprocessing
import os
import random
import resource
import select
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import requests

#: Seed of a fuzz run: ``LIFTGATE_FUZZ_SEED`` (an integer, or ``random`` for a fresh one).
DEFAULT_SEED = 20_260_113
#: Failures listed in full in a report (all of them are counted).
SHOWN_FAILURES = 12


def run_seed() -> int:
    raw = os.environ.get("LIFTGATE_FUZZ_SEED", "").strip()
    if raw == "random":
        return random.SystemRandom().randrange(2**32)
    return int(raw) if raw else DEFAULT_SEED


def scale() -> float:
    """``LIFTGATE_FUZZ_SCALE``: multiplies every shard's examples (and the cases a test expects)."""
    return float(os.environ.get("LIFTGATE_FUZZ_SCALE", "1"))


def shard_seed(seed: int, key: str) -> int:
    """A shard's own seed: the same for a given run seed whatever the scheduling."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big")


@dataclass(frozen=True, slots=True)
class Shard:
    operation: str  # "METHOD /path/{param}", as the OpenAPI document names it
    mode: str  # "positive" | "negative"
    examples: int
    path_parameters: tuple[tuple[str, str], ...] = ()  # pinned to a resource that exists
    credential: str | None = "admin"  # a name in Target.credentials; None: none sent
    # Statuses ≥ 500 that are this operation's documented answer (/readyz: 503 = not ready).
    allowed: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        if self.operation.startswith("hot:"):
            return self.operation
        pins = "".join(f", {k}={v}" for k, v in self.path_parameters)
        return f"{self.operation} [{self.mode}, {self.credential or 'no'} credential{pins}]"


@dataclass(slots=True)
class Score:
    """What a run (or one worker's part of it) saw."""

    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    per_shard: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    failed: int = 0
    slowest_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu_s: float = 0.0  # the workers' own CPU time (generation and sending)

    def add(self, other: Score) -> None:
        self.cases += other.cases
        self.statuses.update(other.statuses)
        self.per_shard.update(other.per_shard)
        self.failures.extend(other.failures[: max(0, SHOWN_FAILURES - len(self.failures))])
        self.failed += other.failed
        self.slowest_s = max(self.slowest_s, other.slowest_s)
        self.latencies.extend(other.latencies)
        self.cpu_s += other.cpu_s

    def p99_s(self) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def summary(self, service: str, seed: int, elapsed_s: float) -> str:
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        return (
            f"fuzz {service}: seed {seed} (LIFTGATE_FUZZ_SEED={seed} reproduces it), {self.cases} cases"
            f" in {elapsed_s:.1f} s ({self.cases / max(elapsed_s, 1e-9):.0f}/s), {self.failed} failed;"
            f" slowest answer {self.slowest_s:.2f} s, p99 {self.p99_s() * 1000:.0f} ms; statuses {{{codes}}};"
            f" fuzzer CPU {self.cpu_s:.0f} s"
        )


class Sender:
    """Sends requests from a few threads, each with its own session; at most ``depth`` queued."""

    def __init__(self, timeout_s: float, concurrency: int, score: Score) -> None:
        self.timeout_s = timeout_s
        self.score = score
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(concurrency * 2)
        self.pool = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fuzz-send")
        self.local = threading.local()

    def submit(
        self, key: str, request: dict[str, Any], describe: Callable[[], str], allowed: tuple[int, ...] = ()
    ) -> None:
        self.slots.acquire()
        self.pool.submit(self._send, key, request, describe, allowed)

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = requests.Session()
        return session

    def _raw(self, request: dict[str, Any]) -> tuple[int, bytes, str | None]:
        """Through http.client, which sends header bytes requests refuses (control characters,
        leading spaces): what a hostile client can put on the wire."""
        parts = urllib.parse.urlsplit(request["url"])
        conn: http.client.HTTPConnection | None = getattr(self.local, "conn", None)
        if conn is not None and conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            # Readable while idle: the server closed this keep-alive connection (its idle
            # timeout). Like urllib3's pool, drop it rather than send into a closed socket.
            conn.close()
            conn = None
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        # A reused connection can still be closed by the server between that check and the
        # send (its keep-alive deadline passing just then): like the gateway's own upstream
        # client, retry once on a fresh connection. A server that drops the request itself
        # drops the retry too, and that is reported.
        for fresh in (conn is None, True):
            if fresh:
                conn = self.local.conn = http.client.HTTPConnection(
                    parts.hostname, parts.port, timeout=self.timeout_s
                )
            assert conn is not None
            try:
                conn.request(request["method"], path, request.get("data"), request["headers"])
                res = conn.getresponse()
                return res.status, res.read(), res.getheader("location")
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                conn.close()
                self.local.conn = None
                if fresh:
                    raise
            except BaseException:
                conn.close()
                self.local.conn = None
                raise
        raise AssertionError("unreachable")

    def _send(
        self, key: str, request: dict[str, Any], describe: Callable[[], str], allowed: tuple[int, ...]
    ) -> None:
        problem: str | None = None
        status = -1
        t0 = time.monotonic()
        try:
            if request.get("raw"):
                status, body, location = self._raw(request)
            else:
                res = self._session().request(**request, timeout=self.timeout_s, allow_redirects=False)
                status, body, location = res.status_code, res.content, res.headers.get("location")
            if status >= 500 and status not in allowed:
                problem = f"answered {status}: {body[:300]!r}"
            elif location is not None and not _own_path(location, request["url"]):
                problem = f"redirects off this service: Location {location!r}"
        except (requests.Timeout, TimeoutError):
            problem = f"no answer within {self.timeout_s:g} s (a hang)"
        except (requests.RequestException, OSError, http.client.HTTPException) as exc:
            problem = f"no answer: {type(exc).__name__}: {str(exc)[:300]}"
            self.local.session = None  # a broken connection: start afresh
        finally:
            self.slots.release()
        elapsed = time.monotonic() - t0
        if problem is None and elapsed > self.timeout_s:
            problem = f"answered after {elapsed:.1f} s, beyond the {self.timeout_s:g} s bound (a hang)"
        with self.lock:
            score = self.score
            score.cases += 1
            score.per_shard[key] += 1
            score.statuses[status] += 1
            score.latencies.append(elapsed)
            score.slowest_s = max(score.slowest_s, elapsed)
            if problem is not None:
                score.failed += 1
                if len(score.failures) < SHOWN_FAILURES:
                    score.failures.append(f"{key}: {problem}\n    {describe()}")

    def close(self) -> None:
        self.pool.shutdown(wait=True)


@dataclass(frozen=True, slots=True)
class Target:
    """A live service and how to reach it. ``credentials`` maps a name to the headers that
    carry it (schemathesis masks ``Authorization`` in the curl commands it writes)."""

    document: dict[str, Any]
    base_url: str
    credentials: dict[str, dict[str, str]]
    timeout_s: float = 10.0
    concurrency: int = 4
    extra: dict[str, Any] = field(default_factory=dict)  # what hand-written strategies draw from


def _run_shards(target: Target, shards: Sequence[Shard], seed: int) -> Score:
    """One worker's part: draw each shard's cases and send them (runs in a child process)."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_dict(target.document) if target.document else None
    score = Score()
    sender = Sender(target.timeout_s, target.concurrency, score)

    def sending_to(key: str, allowed: tuple[int, ...]) -> Callable[[Any], None]:
        def send(case: Any) -> None:
            request = _wire(case.as_transport_kwargs(base_url=target.base_url))
            sender.submit(key, request, lambda: str(case.as_curl_command(base_url=target.base_url)), allowed)

        return send

    def sending_raw(key: str, allowed: tuple[int, ...]) -> Callable[[dict[str, Any]], None]:
        def send(request: dict[str, Any]) -> None:
            full = {**request, "url": target.base_url + request["url"], "raw": True}
            sender.submit(key, full, lambda: describe(full), allowed)

        return send

    try:
        for shard in shards:
            key = shard.key
            if shard.mode == "negative" and not negatable(target.document, shard.operation):
                continue  # nothing to make invalid: Hypothesis would spend its time proving so
            if shard.operation.startswith("hot:"):
                from tests.fuzz import strategies

                raw = strategies.build(shard.operation.removeprefix("hot:"), target.extra)
                test: Callable[..., None] = given(raw)(sending_raw(key, shard.allowed))
            else:
                method, path = shard.operation.split(" ", 1)
                assert schema is not None
                strategy = schema[path][method].as_strategy(
                    generation_mode=schemathesis.GenerationMode(shard.mode),
                    headers=target.credentials[shard.credential] if shard.credential else None,
                    path_parameters=dict(shard.path_parameters) or None,
                )
                test = given(strategy)(sending_to(key, shard.allowed))
            generate = settings(
                max_examples=shard.examples,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(hypothesis_seed(shard_seed(seed, key))(test))
            # Unsatisfiable: nothing in this operation can be made invalid (no parameters, no body).
            with contextlib.suppress(Unsatisfiable):
                generate()
    finally:
        sender.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    score.cpu_s = usage.ru_utime + usage.ru_stime
    return score


def negatable(document: dict[str, Any], operation: str) -> bool:
    """Whether schemathesis' negative mode can draw anything for ``operation``: it needs a
    body or a parameter with a type to break (a bare string in the path has none)."""
    if operation.startswith("hot:"):
        return True
    method, path = operation.split(" ", 1)
    spec = document["paths"][path][method.lower()]
    if "requestBody" in spec:
        return True
    for parameter in spec.get("parameters", []):
        schema = {k: v for k, v in parameter.get("schema", {}).items() if k != "title"}
        if parameter["in"] != "path" or schema != {"type": "string"}:
            return True
    return False


def _wire(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A schemathesis case's request as bytes for ``Sender._raw``: requests encodes it (query,
    JSON body, cookies) and http.client sends it, which costs a fraction of a requests
    session's CPU per request. A request requests refuses to encode goes through requests."""
    try:
        prepared = requests.Request(**kwargs).prepare()
    except (requests.RequestException, ValueError):
        return kwargs
    body = prepared.body.encode() if isinstance(prepared.body, str) else prepared.body
    return {
        "method": prepared.method,
        "url": prepared.url,
        "headers": dict(prepared.headers),
        "data": body,
        "raw": True,
    }


def _own_path(location: str, url: str) -> bool:
    """A redirect target on the same service: a path (never ``//host`` or ``/\\host``, which
    browsers read as another host), or a URL of the host the request was sent to."""
    if location.startswith("/"):
        return not location.startswith(("//", "/\\"))
    here, there = urllib.parse.urlsplit(url), urllib.parse.urlsplit(location)
    return (there.scheme, there.netloc) == (here.scheme, here.netloc)


def describe(request: dict[str, Any]) -> str:
    """A request as a reproducible line (the credential masked: the test knows it)."""
    headers = {
        k: ("[Filtered]" if k.lower() == "authorization" else v) for k, v in request["headers"].items()
    }
    return f"{request['method']} {request['url']} headers={headers!r} body={request.get('data')!r:.600}"


def _split(shards: Iterable[Shard], workers: int) -> list[list[Shard]]:
    """Largest shards first, each to the least loaded worker (by examples)."""
    parts: list[list[Shard]] = [[] for _ in range(workers)]
    load = [0] * workers
    for shard in sorted(shards, key=lambda s: -s.examples):
        i = load.index(min(load))
        parts[i].append(shard)
        load[i] += shard.examples
    return [p for p in parts if p]


def run(target: Target, shards: Sequence[Shard], seed: int, workers: int = 2) -> tuple[Score, float]:
    """Every shard against ``target`` from ``workers`` processes; the score and the seconds taken."""
    t0 = time.monotonic()
    total = Score()
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    factor = scale()
    scaled = [replace(s, examples=max(1, round(s.examples * factor))) for s in shards]
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_run_shards, target, part, seed) for part in _split(scaled, workers)]
        for future in futures:
            total.add(future.result())
    return total, time.monotonic() - t0
