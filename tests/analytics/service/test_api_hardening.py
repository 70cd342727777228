"""The analytics service as an attacker and a careless client meet it (a real subprocess):
read access, fresh reports, hostile paths, oversized and slow requests, bounded metrics."""

from __future__ import annotations

import http.client
import json
import random
import re
import secrets
import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from analytics.service.access import login_ticket
from contracts.events import FeedbackEvent
from tests.analytics.ingest_helpers import interaction
from tests.analytics.report_data import create_experiment, insert_units, simulate_units
from tests.known_secrets import secret
from tests.services import analytics_service

ADMIN = secret("adm")
READ = secret("rd")
MAX_BODY = 64 * 1024
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
KEEP_ALIVE_S = 1


@pytest.fixture(scope="module")
def url(module_database_url: str) -> Iterator[str]:
    with analytics_service(
        module_database_url,
        ADMIN,
        read_token=READ,
        snapshot_interval_s="0",
        rollout_controller="false",
        fresh_min_interval_s="30",
        max_body_bytes=str(MAX_BODY),
        header_timeout_s=str(HEADER_TIMEOUT_S),
        body_timeout_s=str(BODY_TIMEOUT_S),
        keep_alive_s=str(KEEP_ALIVE_S),
        max_head_bytes="8192",
    ) as u:
        yield u


@pytest.fixture(scope="module")
def experiment(module_database_url: str) -> dict[str, Any]:
    from sqlalchemy import create_engine

    engine = create_engine(module_database_url)
    try:
        rng = np.random.default_rng(9)
        with engine.begin() as conn:
            eid, name = create_experiment(
                conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"]
            )
            for v in ("control", "candidate"):
                insert_units(conn, eid, v, simulate_units(rng, 40, thumbs_p=0.2, tokens=50, error_p=0.05))
    finally:
        engine.dispose()
    return {"id": eid, "name": name}


def call(
    base: str,
    method: str,
    path: str,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection; redirects are not followed."""
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    if data is not None and "Content-Type" not in hdrs:
        hdrs["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=hdrs)
        res = conn.getresponse()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
    finally:
        conn.close()


# --- read access -----------------------------------------------------------------------------


READ_PATHS = ["/api/experiments", "/api/metrics", "/openapi.json"]


def test_every_read_needs_a_read_credential_and_health_and_metrics_stay_open(
    url: str, experiment: dict[str, Any]
) -> None:
    paths = [
        *READ_PATHS,
        f"/api/experiments/{experiment['name']}/report",
        f"/api/experiments/{experiment['id']}/rollout",
    ]
    for path in paths:
        status, headers, _ = call(url, "GET", path)
        assert status == 401 and headers.get("www-authenticate") == "Bearer", path
        assert call(url, "GET", path, token="wrong-" + secrets.token_hex(8))[0] == 403, path
        assert call(url, "GET", path, token=READ)[0] in (200, 409), path  # 409: not a rollout
        assert call(url, "GET", path, token=ADMIN)[0] in (200, 409), path
    for page in (
        "/dashboard",
        f"/dashboard/experiments/{experiment['name']}",
        "/docs",
        "/dashboard/static/js/api.js",
    ):
        status, headers, _ = call(url, "GET", page)
        assert status == 303 and headers["location"].startswith("/dashboard/login?next="), page
        assert call(url, "GET", page, token=READ)[0] == 200, page
    assert call(url, "GET", "/healthz")[0] == 200
    assert call(url, "GET", "/metrics")[0] == 200


def test_a_read_only_post_needs_a_read_credential_not_the_admin_token(url: str) -> None:
    # the rollout plan check takes a body but changes nothing: a reader may ask it
    body = {"plan": {"stages": [10, 50, 100]}}
    assert call(url, "POST", "/api/rollout-plans/check", body=body)[0] == 401
    assert call(url, "POST", "/api/rollout-plans/check", "wrong-" + secrets.token_hex(8), body)[0] == 403
    status, _, raw = call(url, "POST", "/api/rollout-plans/check", READ, body)
    assert status == 200 and orjson.loads(raw)["promotion_percent"] == 50
    # any other POST still needs the admin token, before its body is read
    assert call(url, "POST", "/api/metrics", READ, {"name": "x"})[0] == 403


def test_fresh_reports_are_for_operators_and_rate_limited_per_experiment(
    url: str, experiment: dict[str, Any]
) -> None:
    path = f"/api/experiments/{experiment['id']}/report?fresh=true"
    status, _, body = call(url, "GET", path, token=READ)
    assert status == 403 and b"operator role" in body
    assert call(url, "GET", path)[0] == 401
    assert call(url, "GET", path, token=ADMIN)[0] == 200
    status, headers, body = call(url, "GET", path, token=ADMIN)
    assert status == 429 and 0 < int(headers["retry-after"]) <= 30 and b"retry in" in body
    assert call(url, "GET", path.removesuffix("?fresh=true"), token=READ)[0] == 200  # snapshots stay cheap


def _sign_in(url: str, token: str, next_path: str = "/dashboard") -> tuple[int, dict[str, str], bytes]:
    """The sign-in form as a browser sends it: its CSRF field matching its cookie."""
    status, headers, page = call(url, "GET", "/dashboard/login")
    assert status == 200
    match = re.search(rb'name="csrf" value="([^"]+)"', page)
    assert match is not None and headers["set-cookie"].startswith("lg_login=")
    form = urllib.parse.urlencode({"token": token, "next": next_path, "csrf": match.group(1).decode()})
    cookie = {"Cookie": headers["set-cookie"].split(";", 1)[0], **FORM}
    return call(url, "POST", "/dashboard/login", body=form.encode(), headers=cookie)


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_the_sign_in_form_with_the_read_token_gives_a_viewer_session_cookie(url: str) -> None:
    status, headers, _ = _sign_in(url, READ, "/dashboard/experiments/x")
    assert status == 303 and headers["location"] == "/dashboard/experiments/x"
    cookie = headers["set-cookie"]
    assert cookie.startswith("lg_session=") and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert READ not in cookie
    session = {"Cookie": cookie.split(";", 1)[0]}
    assert call(url, "GET", "/api/experiments", headers=session)[0] == 200
    assert call(url, "GET", "/dashboard", headers=session)[0] == 200
    # A viewer's session reads only: a change is refused (without its CSRF token, and with it).
    spec = {"name": "m_" + secrets.token_hex(3), "kind": "mean", "numerator": "requests"}
    status, _, body = call(url, "POST", "/api/metrics", body=spec, headers=session)
    assert status == 403 and b"CSRF" in body
    csrf = json.loads(call(url, "GET", "/admin/me", headers=session)[2])["csrf"]
    status, _, body = call(url, "POST", "/api/metrics", body=spec, headers={**session, "X-CSRF-Token": csrf})
    assert status == 403 and b"needs operator" in body
    # A wrong token, a form without its CSRF token, and a redirect off this service, are refused.
    assert _sign_in(url, "nope-" + secrets.token_hex(8))[0] == 401
    bare = urllib.parse.urlencode({"token": READ}).encode()
    assert call(url, "POST", "/dashboard/login", body=bare, headers=FORM)[0] == 403
    status, headers, _ = _sign_in(url, ADMIN, "//evil.example/x")
    assert status == 303 and headers["location"] == "/dashboard"
    # A forged or expired cookie is no session.
    forged = {"Cookie": "lg_session=9999999999.abc.def"}
    assert call(url, "GET", "/api/experiments", headers=forged)[0] == 401


def test_a_sign_in_link_works_once(url: str) -> None:
    link = f"/dashboard/login?ticket={login_ticket(ADMIN, READ)}&next=/dashboard"
    status, headers, _ = call(url, "GET", link)
    assert status == 303 and headers["location"] == "/dashboard" and "lg_session=" in headers["set-cookie"]
    status, headers, body = call(url, "GET", link)
    assert status == 401 and "lg_session" not in headers.get("set-cookie", "") and b"already used" in body
    expired = login_ticket(ADMIN, READ, ttl_s=-1)
    assert call(url, "GET", f"/dashboard/login?ticket={expired}")[0] == 401
    other = login_ticket(ADMIN, "another-read-token-" + secrets.token_hex(4))  # signed with other tokens
    assert call(url, "GET", f"/dashboard/login?ticket={other}")[0] == 401


# --- hostile input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/experiments/%C2%B2/report", 404),  # "²".isdigit() is True, int("²") is not
        ("/api/experiments/%00/report", 400),
        ("/api/experiments/a%00b/rollout", 400),
        ("/api/experiments/12345678901234567890/report", 404),  # 20 digits: no int4 id
        ("/api/experiments/2147483648/report", 404),
        ("/api/experiments/" + "n" * 300 + "/report", 404),
        ("/dashboard/static/%00", 400),
        ("/dashboard/static/..%2F..%2Fsettings.py", 404),
        ("/dashboard/experiments/%00", 400),
        ("/api/experiments/%FF%FE/report", 404),
    ],
)
def test_hostile_paths_get_a_reason_never_a_500(url: str, path: str, expected: int) -> None:
    status, _, body = call(url, "GET", path, token=READ)
    assert status == expected, body
    assert "detail" in json.loads(body)
    assert call(url, "GET", path)[0] in {400, 401, 303}  # unauthenticated: refused, never a 500


@pytest.mark.parametrize(
    ("numerator", "reason"),
    [
        ("requests * 1e999", "not finite"),
        ("requests * " + "9" * 400, "out of range"),
        ("-" * 990 + "requests", "nested deeper"),
    ],
)
def test_unbounded_metric_definitions_are_refused_with_a_reason(
    url: str, numerator: str, reason: str
) -> None:
    spec = {"name": "m_" + secrets.token_hex(3), "kind": "mean", "numerator": numerator}
    status, _, body = call(url, "POST", "/api/metrics", token=ADMIN, body=spec)
    assert status == 422 and reason in json.loads(body)["detail"]


def test_non_finite_numbers_in_a_definition_body_are_refused(url: str) -> None:
    raw = b'{"name": "m_inf", "kind": "mean", "numerator": "requests", "guardrail": true, "margin": 1e999}'
    status, _, body = call(url, "POST", "/api/metrics", token=ADMIN, body=raw)
    assert status == 422 and "infinity" in json.loads(body)["detail"]
    for nested in (b"[" * 30_000 + b"]" * 30_000, b'{"a":' * 5_000 + b"1" + b"}" * 5_000):
        status, _, body = call(url, "POST", "/api/metrics", token=ADMIN, body=nested)
        assert status == 422 and "invalid JSON" in json.loads(body)["detail"]


def test_a_body_that_is_not_an_object_is_refused_naming_the_body(url: str) -> None:
    """Pydantic locates these errors at the body itself: the reason began with ": " (no
    field to name) — it names the body instead."""
    for raw, reason in ((b"", "body: Field required"), (b"[1, 2]", "body: Input should be a valid dictionary"),
                        (b"null", "body: Input should be a valid dictionary")):  # fmt: skip
        status, _, body = call(url, "POST", "/admin/upstreams", token=ADMIN, body=raw)
        assert status == 422 and json.loads(body)["detail"].startswith(reason), (raw, body)
    spec = {"name": "up-" + secrets.token_hex(3), "base_url": "http://127.0.0.1:9/v1", "bogus": 1}
    status, _, body = call(url, "POST", "/admin/upstreams", token=ADMIN, body=spec)
    assert status == 422 and json.loads(body)["detail"].startswith("bogus: "), body


def test_reports_answer_200_after_1_7e308_feedback_and_with_overflowing_rollups(
    url: str, module_database_url: str
) -> None:
    from sqlalchemy import create_engine

    engine: Engine = create_engine(module_database_url)
    try:
        with engine.begin() as conn:
            eid, name = create_experiment(
                conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate", "sig_mean"]
            )
            conn.execute(
                text(
                    "INSERT INTO metric_definitions (name, definition) VALUES ('sig_mean', CAST(:d AS jsonb))"
                ),
                {
                    "d": orjson.dumps(
                        {"name": "sig_mean", "kind": "mean", "numerator": "counters['sig']"}
                    ).decode()
                },
            )
        events: list[Any] = []
        for i in range(10):
            ev = interaction(eid, "control" if i % 2 else "candidate", f"u{i}")
            events += [
                ev,
                FeedbackEvent(request_id=ev.request_id, unit_id=ev.unit_id, kind="sig", value=1.7e308),
            ]
        assert ingest(engine, events).dead_lettered == 10
        status, _, body = call(
            url, "GET", f"/api/experiments/{name}/report", token=READ
        )  # no snapshot: computed
        assert status == 200, body
        # Rollups written before values were bounded: the metric fails alone, the report answers.
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE unit_rollups SET counters = '{\"sig\": 1.7e308}' WHERE experiment_id = :e"),
                {"e": eid},
            )
        status, _, body = call(url, "GET", f"/api/experiments/{eid}/report", token=READ)
        report = json.loads(body)
        assert status == 200 and any(e["code"] == "metric_failed" for e in report["errors"])
        assert {r["metric"] for r in report["results"]} == {"thumbs_up_rate"}
    finally:
        engine.dispose()


# --- sizes and slow clients -----------------------------------------------------------------


def _connect(url: str) -> socket.socket:
    parts = urllib.parse.urlsplit(url)
    s = socket.create_connection((parts.hostname, parts.port), timeout=10)
    return s


def _answer(s: socket.socket, timeout: float) -> bytes:
    """What the server sends before closing (or within ``timeout``)."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def test_an_oversized_body_is_refused_from_its_headers_before_a_byte_is_read(url: str) -> None:
    for token in (ADMIN, "wrong-" + secrets.token_hex(8)):
        s = _connect(url)
        s.sendall(
            b"POST /api/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer "
            + token.encode()
            + b"\r\nContent-Length: "
            + str(200 * 2**20).encode()
            + b"\r\n\r\n"
        )
        answer = _answer(s, 5)
        s.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_wrong_token_is_refused_before_the_body_is_read(url: str) -> None:
    s = _connect(url)
    s.sendall(
        b"POST /api/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer wrong-token-0123456789\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    answer = _answer(s, 5)  # nothing of the body was sent
    s.close()
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]


def test_a_chunked_body_is_cut_off_as_it_crosses_the_limit(url: str) -> None:
    s = _connect(url)
    s.sendall(
        b"POST /api/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + ADMIN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 8192
    sent = 0
    try:
        for _ in range(200):  # up to 1.6 MiB; the limit is 64 KiB
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _answer(s, 5)
    s.close()
    assert answer.startswith(b"HTTP/1.1 413") or sent < 40 * len(chunk), (sent, answer[:200])


def test_slow_and_silent_clients_are_closed_and_others_still_served(url: str) -> None:
    silent = [_connect(url) for _ in range(20)]
    slowloris = [_connect(url) for _ in range(20)]
    short_body = [_connect(url) for _ in range(10)]
    for s in slowloris:
        s.sendall(b"GET /api/experiments HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    for s in short_body:
        s.sendall(
            b"POST /api/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
            + ADMIN.encode()
            + b'\r\nContent-Length: 100\r\n\r\n{"na'
        )
    t0 = time.monotonic()
    # Meanwhile a well-behaved client is served.
    assert call(url, "GET", "/api/experiments", token=READ)[0] == 200
    for group, limit, status in (
        (silent, HEADER_TIMEOUT_S, b"408"),
        (slowloris, HEADER_TIMEOUT_S, b"408"),
        (short_body, BODY_TIMEOUT_S, b"408"),
    ):
        for s in group:
            answer = _answer(s, limit + 5)
            s.close()
            assert status in answer.split(b"\r\n", 1)[0], answer[:200]
    assert time.monotonic() - t0 < max(HEADER_TIMEOUT_S, BODY_TIMEOUT_S) + 5


def test_an_idle_keep_alive_connection_is_closed(url: str) -> None:
    s = _connect(url)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    t0 = time.monotonic()
    answer = _answer(s, KEEP_ALIVE_S + 5)  # the response, then the close
    s.close()
    assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - t0 < KEEP_ALIVE_S + 4


def test_a_request_head_over_the_limit_is_refused(url: str) -> None:
    s = _connect(url)
    s.sendall(b"GET /api/experiments HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n")
    answer = _answer(s, 5)
    s.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_random_requests_never_get_a_server_error(url: str, experiment: dict[str, Any]) -> None:
    """Seeded random requests over every route: odd path segments, methods, queries,
    credentials and bodies. Bounded: 600 requests on keep-alive connections."""
    rng = random.Random(13)
    segments = ["", "²", "%00", "%C2%B2", "%FF", "9" * 20, "-1", "0", "2147483648", str(experiment["id"]),
                experiment["name"], "a" * 300, "..%2F..", "%2e%2e", "x y", "ü", "%", "%zz", "\u202e", "advance",
                "thumbs_up_rate", "%0A", "static/js/api.js"]  # fmt: skip
    templates = ["/api/experiments", "/api/experiments/{}/report", "/api/experiments/{}/snapshot",
                 "/api/experiments/{}/rollout", "/api/experiments/{}/rollout/{}", "/api/metrics",
                 "/api/metrics/{}", "/dashboard/experiments/{}", "/dashboard/static/{}", "/dashboard/login",
                 "/dashboard/logout", "/docs", "/openapi.json", "/{}", "/healthz", "/metrics"]  # fmt: skip
    queries = [
        "",
        "?fresh=1",
        "?fresh=maybe",
        "?fresh=%00",
        "?next=//evil&ticket=" + "x" * 300,
        "?ticket=1.2.3",
    ]
    numbers: list[Any] = [0, -0.0, 1e308, -1, 2**70, 0.5, "1e999", None, True]
    exprs = [
        "requests",
        "requests * 1e999",
        "-" * 500 + "requests",
        "counters['x']",
        "a" * 2000,
        "1/0",
        "\x00",
    ]

    def body() -> bytes | None:
        pick = rng.randrange(6)
        if pick == 0:
            return None
        if pick == 1:
            return rng.choice([b"", b"{", b"[]", b"null", b"[" * 5000 + b"]" * 5000, b"\xff\xfe", b"NaN"])
        spec = {"name": rng.choice(["m_" + str(rng.randrange(99)), "Bad Name", "", "thumbs_up_rate"]),
                "kind": rng.choice(["mean", "ratio", "proportion", "quantile", "x"]),
                "numerator": rng.choice(exprs), "denominator": rng.choice([None, *exprs]),
                "q": rng.choice(numbers), "margin": rng.choice(numbers), "histogram": rng.choice([None, "latency"]),
                "guardrail": rng.choice(numbers), "description": rng.choice(["", "\x00", "d" * 5000])}  # fmt: skip
        return json.dumps({k: v for k, v in spec.items() if rng.random() < 0.8}).encode()

    def path() -> str:
        template = rng.choice(templates)
        filled = template.format(*(rng.choice(segments) for _ in range(template.count("{}"))))
        return urllib.parse.quote(filled, safe="/%?=&'") + rng.choice(queries)

    failures = []
    for _ in range(600):
        method = rng.choice(["GET", "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
        token = rng.choice([None, READ, ADMIN, ADMIN, "wrong-token-0123456789"])
        p, b = path(), body()
        status, _, _ = call(url, method, p, token=token, body=b)
        if status >= 500:
            failures.append((status, method, p, token == ADMIN, (b or b"")[:120]))
    assert failures == []
