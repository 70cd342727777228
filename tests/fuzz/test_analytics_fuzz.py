"""The analytics service fuzzed from its own OpenAPI document (``/openapi.json``, read with
the read token) by schemathesis: positive and negative data for every operation, as the
admin, as a reader and with no credential, path parameters generated or pinned to an A/B
experiment with data, a running rollout, a custom metric and each rollout action; and its
dashboard and sign-in page, which the document does not describe, with hand-written
strategies (``strategies.dashboard``: traversal paths, forged sessions and tickets, open
redirect attempts). The service is a real process (``python -m analytics``) on its own
database; no answer may be ≥ 500, none may take longer than the deadline, no redirect may
leave the service.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import create_engine, text

from tests.analytics.report_data import create_experiment, insert_units, simulate_units
from tests.fuzz.driver import Shard, Target, run, run_seed, scale
from tests.fuzz.services import Service, analytics, http_json
from tests.known_secrets import secret

ADMIN = secret("fuzz-an-admin")
READ = secret("fuzz-an-read")
MIN_CASES = 20_000


@pytest.fixture(scope="module")
def data(module_database_url: str) -> dict[str, str]:
    """An A/B experiment with 2 × 60 units, a running rollout with a plan, a custom metric."""
    engine = create_engine(module_database_url)
    try:
        rng = np.random.default_rng(13)
        with engine.begin() as conn:
            ab_id, ab = create_experiment(
                conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"]
            )
            for v in ("control", "candidate"):
                insert_units(conn, ab_id, v, simulate_units(rng, 60, thumbs_p=0.2, tokens=50, error_p=0.05))
            ro_id, ro = create_experiment(conn, [("control", 90), ("candidate", 10)], mode="rollout")
            plan = {"stages": [10, 50, 100], "guardrails": [{"metric": "error_rate", "margin": 0.1}]}
            conn.execute(
                text(
                    "UPDATE experiments SET rollout_plan = CAST(:p AS jsonb), rollout_stage = 0 WHERE id = :e"
                ),
                {"p": orjson.dumps(plan).decode(), "e": ro_id},
            )
            for v in ("control", "candidate"):
                insert_units(conn, ro_id, v, simulate_units(rng, 40, thumbs_p=0.2, tokens=50, error_p=0.02))
            spec = {"name": "fz_metric", "kind": "mean", "numerator": "completion_tokens"}
            conn.execute(
                text(
                    "INSERT INTO metric_definitions (name, definition) VALUES ('fz_metric', CAST(:d AS jsonb))"
                ),
                {"d": orjson.dumps(spec).decode()},
            )
    finally:
        engine.dispose()
    return {"ab": ab, "ab_id": str(ab_id), "rollout": ro, "rollout_id": str(ro_id)}


@pytest.fixture(scope="module")
def service(
    module_database_url: str, data: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("fuzz-analytics") / "analytics.log"
    # The rollout controller and snapshotter stay off: the fuzzer's own calls are the load.
    with analytics(
        module_database_url,
        ADMIN,
        READ,
        log,
        LIFTGATE_SNAPSHOT_INTERVAL_S="0",
        LIFTGATE_ROLLOUT_CONTROLLER="false",
        LIFTGATE_FRESH_MIN_INTERVAL_S="1",
    ) as an:
        yield an


def _shards(data: dict[str, str]) -> list[Shard]:
    def each(
        operation: str, examples: int, *pins: tuple[tuple[str, str], ...], negative: int | None = None
    ) -> list[Shard]:
        """Both modes as the admin (who gets furthest), generated and pinned path parameters
        (``negative`` cases per pin when fewer suffice); a tenth of the positive cases as a
        reader and with no credential."""
        modes = (("positive", examples), ("negative", examples if negative is None else negative))
        out = [Shard(operation, mode, n, pin, "admin") for pin in ((), *pins) for mode, n in modes]
        out += [Shard(operation, "positive", max(1, examples // 10), (), who) for who in ("read", None)]
        return out

    experiments = [(("id_or_name", data[k]),) for k in ("ab", "ab_id", "rollout", "rollout_id")]
    actions = [
        (("id_or_name", data["rollout"]), ("action", action))
        for action in ("advance", "pause", "resume", "rollback")
    ]
    return [
        *each("GET /healthz", 5),
        *each("GET /metrics", 5),
        *each("GET /api/experiments", 20),
        # Its only parameter is the boolean ``fresh``: a few hundred cases per experiment try
        # all there is (more were near-identical GETs of the costliest answer).
        *each("GET /api/experiments/{id_or_name}/report", 300, *experiments, negative=200),
        *each("POST /api/experiments/{id_or_name}/snapshot", 250, experiments[0]),
        *each("GET /api/metrics", 20),
        *each("POST /api/metrics", 1_900),
        *each("PUT /api/metrics/{name}", 900, (("name", "fz_metric"),)),
        *each("DELETE /api/metrics/{name}", 500, (("name", "fz_metric"),)),
        *each("GET /api/experiments/{id_or_name}/rollout", 400, *experiments[2:]),
        *each("POST /api/rollout-plans/check", 1_300),
        *each("POST /api/experiments/{id_or_name}/rollout/{action}", 250, *actions),
        # The dashboard and its sign-in page are not in the document: hand-written strategies.
        Shard("hot:dashboard", "positive", 7_000),
    ]


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # a few minutes in CI; more on a busy machine
def test_the_analytics_service_answers_every_generated_request_below_500_in_time(
    service: Service, data: dict[str, str]
) -> None:
    status, document = http_json("GET", service.url + "/openapi.json", READ)
    assert status == 200 and isinstance(document, dict)
    credentials: dict[str, dict[str, Any]] = {
        "admin": {"Authorization": f"Bearer {ADMIN}"},
        "read": {"Authorization": f"Bearer {READ}"},
    }
    extra = {"experiments": [data["ab"], data["rollout"]], "read_token": READ, "admin_token": ADMIN}
    target = Target(document, service.url, credentials, extra=extra)
    seed = run_seed()
    cpu0 = service.cpu_s()
    score, elapsed = run(target, _shards(data), seed)
    summary = score.summary("analytics", seed, elapsed) + f", service CPU {service.cpu_s() - cpu0:.0f} s"
    print(summary)
    print("cases per operation:", dict(sorted(score.per_shard.items())))
    assert score.failed == 0, summary + "\n" + "\n".join(score.failures)
    assert score.cases >= MIN_CASES * scale(), summary
    assert service.alive(), service.log_text()[-3000:]
    assert "Traceback" not in service.log_text(), service.log_text()[-5000:]
