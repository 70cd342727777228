"""The CLI against a running gateway: experiments, feedback import, simulated users."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.telemetry import GatewayMetrics
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from liftgate.traffic import TrafficConfig, TrafficRun
from liftgate.users import FeedbackModel
from tests.gateway.conftest import GatewayThread, MemorySink
from tests.liftgate.frontdoor import ADMIN_TOKEN, Gateway, free_port, liftgate

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)


@pytest.fixture(scope="module")
def models_url() -> Iterator[str]:
    def model(name: str, quality: float) -> SimulatorModel:
        return SimulatorModel(name, latency_ms=4.0, latency_sd=1.0, ttft_ms=2.0, ttft_sd=0.5, tokens=20.0,
                              tokens_sd=4.0, quality=quality)  # fmt: skip

    models = [model("good", 0.9), model("poor", 0.1)]
    with SimulatorProcess(models) as sim:
        yield sim.url + "/v1"


@pytest.fixture(scope="module")
def gateway(database_url: str) -> Iterator[Gateway]:
    with Gateway(database_url) as gw:
        yield gw


def _experiment_file(tmp_path: Path, name: str, route: str, models_url: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"""
upstreams:
  - {{name: {name}-up, base_url: "{models_url}"}}
experiments:
  - name: {name}
    route: {route}
    mode: ab
    variants:
      - {{name: good, upstream: {name}-up, model: good, weight: 50, is_control: true}}
      - {{name: poor, upstream: {name}-up, model: poor, weight: 50}}
"""
    )
    return path


def _wait_route(gateway: Gateway, route: str, present: bool = True) -> None:
    import urllib.request

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with urllib.request.urlopen(gateway.url + "/v1/models", timeout=5) as resp:
            names = {m["id"] for m in json.load(resp)["data"]}
        if (route in names) == present:
            return
        time.sleep(0.1)
    raise AssertionError(f"route {route} {'never appeared' if present else 'still served'}")


def test_experiments_lifecycle_through_the_cli(
    gateway: Gateway, models_url: str, tmp_path: Path, unique_name: str
) -> None:
    name, route = unique_name, f"r-{unique_name}"
    created = liftgate("experiments", "create", "-f", str(_experiment_file(tmp_path, name, route, models_url)),
                       "--gateway", gateway.url)  # fmt: skip
    assert created.returncode == 0, created.stderr + created.stdout
    assert f"experiment {name} created" in created.stdout

    listed = liftgate("experiments", "list", "--gateway", gateway.url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {e["name"]: e for e in json.loads(listed.stdout)}
    assert rows[name]["status"] == "draft" and rows[name]["route"] == route

    for action, status in (
        ("start", "running"),
        ("pause", "paused"),
        ("start", "running"),
        ("stop", "stopped"),
    ):
        res = liftgate("experiments", action, name, "--gateway", gateway.url)
        assert res.returncode == 0, res.stderr
        shown = liftgate("experiments", "show", name, "--gateway", gateway.url)
        assert json.loads(shown.stdout)["status"] == status

    # Creating it again is a clear error (non-zero exit), unless --exist-ok.
    again = liftgate("experiments", "create", "-f", str(tmp_path / f"{name}.yaml"), "--gateway", gateway.url)
    assert again.returncode == 1 and "error" in again.stderr
    ok = liftgate(
        "experiments", "create", "-f", str(tmp_path / f"{name}.yaml"), "--exist-ok", "--gateway", gateway.url
    )
    assert ok.returncode == 0 and "exists: kept" in ok.stdout


def test_cli_errors_are_clear_and_non_zero(gateway: Gateway, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nroute: y\n")
    res = liftgate("experiments", "create", "-f", str(bad), "--gateway", gateway.url)
    assert res.returncode == 2 and "missing variants" in res.stderr

    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(
        "name: inv\nroute: inv\nmode: ab\nvariants:\n  - {name: a, upstream: nowhere, model: m, weight: 1}\n"
        "  - {name: b, upstream: nowhere, model: m, weight: 1}\n"
    )
    res = liftgate("experiments", "create", "-f", str(invalid), "--gateway", gateway.url)
    assert res.returncode == 1 and "422" in res.stderr  # the gateway's reason is shown

    res = liftgate("experiments", "list", "--gateway", gateway.url, token="wrong-token-" + "x" * 20)
    assert res.returncode == 1 and ("401" in res.stderr or "403" in res.stderr)

    res = liftgate("experiments", "show", "no-such-experiment", "--gateway", gateway.url)
    assert res.returncode == 1 and "404" in res.stderr

    res = liftgate("experiments", "list", "--gateway", f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 1 and "cannot reach" in res.stderr

    res = liftgate("experiments", "list", "--gateway", gateway.url, "--state-dir", str(tmp_path), token=None)
    assert res.returncode == 2 and "no admin token" in res.stderr


def test_simulated_users_through_the_gateway_follow_each_variants_quality(
    gateway: Gateway, models_url: str, tmp_path: Path, unique_name: str
) -> None:
    name, route = unique_name, f"r-{unique_name}"
    res = liftgate("experiments", "create", "-f", str(_experiment_file(tmp_path, name, route, models_url)),
                   "--start", "--gateway", gateway.url)  # fmt: skip
    assert res.returncode == 0, res.stderr
    _wait_route(gateway, route)

    t0 = time.monotonic()
    sim = liftgate("simulate", "--gateway", gateway.url, "--route", route, "--users", "40", "--duration", "90",
                   "--rate", "0", "--max-requests", "600", "--concurrency", "8", "--quiet", "--seed", "3")  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert time.monotonic() - t0 < 60, "the request budget ends the run, not the duration"

    interactions = [e for e in gateway.sink.interactions() if e.route == route]
    assert len(interactions) >= 550
    by_unit: dict[str, set[str | None]] = {}
    for e in interactions:
        by_unit.setdefault(e.unit_id, set()).add(e.variant)
    assert all(len(v) == 1 for v in by_unit.values()), "sticky: one variant per simulated user"
    assert 20 <= len(by_unit) <= 40 and all(u.startswith("user-3-") for u in by_unit)
    per_unit = sorted(Counter(e.unit_id for e in interactions).values(), reverse=True)
    assert per_unit[0] >= 4 * per_unit[len(per_unit) // 2], "heavy users send far more than the median user"
    assert {e.tags.get("task") for e in interactions} == {"code", "math", "chat"}
    turns = Counter(e.conversation_id for e in interactions)
    assert max(turns.values()) >= 2, "multi-turn conversations share a conversation id"
    assert any(e.stream for e in interactions) and any(not e.stream for e in interactions)

    variant_of = {e.request_id: e.variant for e in interactions}
    votes: dict[str, Counter[str]] = {"good": Counter(), "poor": Counter()}
    for f in gateway.sink.feedback():
        variant = variant_of.get(f.request_id)
        if variant in votes:
            votes[variant][f.kind] += 1
    rates = {}
    for variant, expected_up in (("good", 0.9), ("poor", 0.1)):
        c = votes[variant]
        n = c["thumbs_up"] + c["thumbs_down"]
        # How many users (and so votes) each arm gets depends on the experiment's random salt
        # and on a few heavy users, so bound the share by its sampling error, not a fixed width.
        assert n >= 15, (variant, c)
        rates[variant] = c["thumbs_up"] / n
        tolerance = 3.5 * (expected_up * (1 - expected_up) / n) ** 0.5 + 0.02
        assert abs(rates[variant] - expected_up) < tolerance, (variant, c)
    assert rates["good"] - rates["poor"] > 0.5, rates
    # Regenerations and copies follow each answer's quality (0.9 good, 0.1 poor) as
    # liftgate.users.react says; compared per arm with what its own answers make expected
    # (the arms get different numbers of requests and tasks), within 3.5 standard errors.
    fm = FeedbackModel()
    for variant, q in (("good", 0.9), ("poor", 0.1)):
        answers = [e for e in interactions if e.variant == variant]
        probs = {
            "regenerate": [fm.regenerate_max * (1 - q)] * len(answers),
            "copy": [min(1.0, fm.copy_max * q * (fm.copy_code_boost if e.tags.get("task") == "code" else 1.0))
                     for e in answers],
        }  # fmt: skip
        for kind, ps in probs.items():
            expected, sd = sum(ps), sum(p * (1 - p) for p in ps) ** 0.5
            observed = votes[variant][kind]
            assert abs(observed - expected) < 3.5 * sd + 0.02 * len(ps), (variant, kind, observed, expected)
    assert votes["good"]["continued"] > 0


def test_feedback_import_posts_lines_and_reports_rejected_ones(gateway: Gateway, tmp_path: Path) -> None:
    before = len(gateway.sink.feedback())
    path = tmp_path / "feedback.jsonl"
    lines = [
        json.dumps({"request_id": "req-import-1", "kind": "thumbs_up"}),
        json.dumps({"request_id": "req-import-2", "kind": "rating", "value": 4, "unit_id": "u-9"}),
        "",
        "not json",
        json.dumps({"kind": "thumbs_up"}),
        json.dumps(
            {"request_id": "req-import-3", "kind": "thumbs_up", "value": 7}
        ),  # gateway: must be 0 or 1
        json.dumps({"request_id": "req-import-4", "kind": "my_signal", "value": 2.5}),
    ]
    path.write_text("\n".join(lines) + "\n")
    res = liftgate("feedback", "import", str(path), "--gateway", gateway.url)
    assert res.returncode == 1
    assert "line 4: rejected: not JSON" in res.stderr
    assert "line 5: rejected: missing 'request_id'" in res.stderr
    assert "line 6: rejected: HTTP 400" in res.stderr
    # No metric reads 'my_signal': an undefined kind is refused, not stored unread.
    assert "line 7: rejected: HTTP 400: kind 'my_signal' is not defined" in res.stderr
    # The gateway never served these ids: accepted, each line reported with its warning.
    assert "line 1: warning: unknown_request_id" in res.stderr
    assert "2 accepted (2 with warnings), 4 rejected" in res.stderr
    got = {(f.request_id, f.kind, f.value, f.unit_id) for f in gateway.sink.feedback()[before:]}
    assert got == {
        ("req-import-1", "thumbs_up", 1.0, ""),
        ("req-import-2", "rating", 4.0, "u-9"),
    }


def test_real_upstreams_are_registered_with_the_model_they_serve(models_url: str) -> None:
    from liftgate.demo import served_model

    assert served_model(models_url, "poor") == "poor"  # the name is served: keep it
    assert served_model(models_url, "prod") == "good"  # else the server's first model
    assert served_model(models_url.removesuffix("/v1"), "prod") == "good"
    assert served_model(f"http://127.0.0.1:{free_port()}/v1", "prod", timeout_s=1) == "prod"


def test_cli_commands_reach_a_running_up_on_custom_ports_through_its_state_file(
    gateway: Gateway, tmp_path: Path
) -> None:
    """No URL flag: `feedback import` posts to the gateway `liftgate up` recorded, and
    `report` / `rollout check` ask the analytics URL it recorded (here a closed port, named in
    the error), not the default 8080/8090."""
    closed = free_port()
    (tmp_path / "up.json").write_text(
        json.dumps(
            {
                "gateway": gateway.url,
                "analytics": f"http://127.0.0.1:{closed}",
                "admin": f"http://127.0.0.1:{closed}",
            }
        )
    )
    before = len(gateway.sink.feedback())
    lines = tmp_path / "feedback.jsonl"
    lines.write_text(json.dumps({"request_id": "req-state-file-1", "kind": "thumbs_up"}) + "\n")
    res = liftgate("feedback", "import", str(lines), "--state-dir", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert [f.request_id for f in gateway.sink.feedback()[before:]] == ["req-state-file-1"]
    report = liftgate("report", "anything", "--state-dir", str(tmp_path))
    assert report.returncode == 1 and f"127.0.0.1:{closed}" in report.stderr
    plan = tmp_path / "plan.yaml"
    plan.write_text("stages: [5, 50, 100]\n")
    check = liftgate("rollout", "check", str(plan), "--state-dir", str(tmp_path))
    assert check.returncode == 2 and f"127.0.0.1:{closed}" in check.stderr


def test_feedback_import_refuses_a_rating_without_a_value_naming_its_line(
    gateway: Gateway, tmp_path: Path
) -> None:
    before = len(gateway.sink.feedback())
    path = tmp_path / "ratings.jsonl"
    lines = [
        json.dumps({"request_id": "req-rating-1", "kind": "rating", "value": 7}),
        json.dumps({"request_id": "req-rating-2", "kind": "rating"}),
        json.dumps({"request_id": "req-rating-3", "kind": "rating", "value": None}),
        json.dumps({"request_id": "req-rating-4", "kind": "thumbs_up", "value": None}),
    ]
    path.write_text("\n".join(lines) + "\n")
    res = liftgate("feedback", "import", str(path), "--gateway", gateway.url)
    assert res.returncode == 1
    assert "line 2: rejected: 'value' is required for kind 'rating'" in res.stderr
    assert "line 3: rejected: 'value' is required for kind 'rating'" in res.stderr
    assert "2 accepted (2 with warnings), 2 rejected" in res.stderr
    got = {(f.request_id, f.kind, f.value) for f in gateway.sink.feedback()[before:]}
    assert got == {("req-rating-1", "rating", 7.0), ("req-rating-4", "thumbs_up", 1.0)}


def test_a_simulation_faster_than_the_feedback_rate_waits_out_429s_and_loses_no_feedback(
    database_url: str, models_url: str, tmp_path: Path, unique_name: str
) -> None:
    # All simulated users share one client address: an unpaced run meets the gateway's
    # per-client feedback rate and must wait out its 429s, not thin the signals it reports.
    sink = MemorySink()
    settings = GatewaySettings(
        admin_token=ADMIN_TOKEN, database_url=database_url, refresh_interval_s=0.2, client_keys="off",
        feedback_rate=40.0, feedback_burst=5,
    )  # fmt: skip
    with GatewayThread(create_app(settings, sink, metrics=GatewayMetrics())) as gw:
        name, route = unique_name, f"r-{unique_name}"
        res = liftgate("experiments", "create", "-f", str(_experiment_file(tmp_path, name, route, models_url)),
                       "--start", "--gateway", gw.url)  # fmt: skip
        assert res.returncode == 0, res.stderr
        deadline = time.monotonic() + 10
        while route not in gw.app.runtime.snapshot().routes and time.monotonic() < deadline:
            time.sleep(0.05)
        config = TrafficConfig(
            gateway_url=gw.url, route=route, users=10, duration_s=60, max_requests=80, rate=None, concurrency=4,
            seed=5,
        )  # fmt: skip
        stats = asyncio.run(TrafficRun(config).run())
        # An accepted call's event is emitted after its answer went out: let the last ones land.
        deadline = time.monotonic() + 5
        while len(sink.feedback()) < stats.feedback_sent and time.monotonic() < deadline:
            time.sleep(0.02)
        stored = len(sink.feedback())
    assert stats.requests >= 80 and stats.errors == 0, stats.last_error
    assert stats.feedback_retried > 0, "the run was faster than the limit: some feedback met a 429"
    assert stats.feedback_failed == 0, stats.last_error
    assert stored == stats.feedback_sent > 0
