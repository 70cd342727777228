"""The gateway's admin API and public non-completion routes, fuzzed from its own OpenAPI
document (``/admin/openapi.json``, read with the admin token) by schemathesis: positive and
negative data for every operation, with and without credentials, path parameters generated
or pinned to upstreams, experiments and keys that exist. The gateway is a real process on
its own database (``python -m gateway``, client keys required); no answer may be ≥ 500, none
may take longer than the deadline. The completion routes are fuzzed by
``test_hot_path_fuzz`` (together: the gateway's cases).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.driver import Shard, Target, run, run_seed, scale
from tests.fuzz.services import Service, gateway, http_json
from tests.known_secrets import secret

ADMIN = secret("fuzz-gw-admin")
UPSTREAM_KEY = secret("sk-fuzz-upstream")
#: Cases this test must send (the hot path's test sends the rest of the gateway's 20,000).
MIN_CASES = 11_000


@pytest.fixture(scope="module")
def service(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("fuzz-gateway") / "gateway.log"
    spool = log.parent / "spool"
    with gateway(
        module_database_url, ADMIN, log, LIFTGATE_CLIENT_KEYS="required", LIFTGATE_SPOOL_DIR=str(spool)
    ) as gw:
        yield gw


def _resources(url: str) -> dict[str, str]:
    """What pinned path parameters name: an upstream per verb, experiments in each state, a key."""

    def admin(method: str, path: str, body: object = None) -> object:
        status, data = http_json(method, url + path, ADMIN, body)
        assert status < 300, (path, status, data)
        return data

    for name in ("fz-up-read", "fz-up-patch", "fz-up-used", "fz-up-free"):
        admin(
            "POST",
            "/admin/upstreams",
            {"name": name, "base_url": "http://127.0.0.1:9/v1", "api_key": UPSTREAM_KEY},
        )
    variants = [
        {"name": "control", "upstream": "fz-up-used", "model": "m", "weight": 50, "is_control": True},
        {"name": "cand", "upstream": "fz-up-used", "model": "m2", "weight": 50},
    ]
    ids = {}
    for name, route in (("fz-exp-draft", "fz-r1"), ("fz-exp-running", "fz-r2"), ("fz-exp-rollout", "fz-r3")):
        body: dict[str, object] = {"name": name, "route": route, "mode": "ab", "variants": variants}
        if name == "fz-exp-rollout":
            body |= {"mode": "rollout", "rollout_plan": {"stages": [5, 25, 50, 100]}}
        created = admin("POST", "/admin/experiments", body)
        assert isinstance(created, dict)
        ids[name] = str(created["id"])
    admin("POST", "/admin/experiments/fz-exp-running/start")
    key = admin("POST", "/admin/api-keys", {"name": "fz-key"})
    assert isinstance(key, dict)
    return {"client_key": str(key["key"]), "running_id": ids["fz-exp-running"], **ids}


def _shards(resources: dict[str, str]) -> list[Shard]:
    def both(
        operation: str,
        examples: int,
        *pins: tuple[tuple[str, str], ...],
        credential: str = "admin",
        allowed: tuple[int, ...] = (),
    ) -> list[Shard]:
        out = [Shard(operation, mode, examples, (), credential, allowed) for mode in ("positive", "negative")]
        for pin in pins:
            out += [
                Shard(operation, mode, examples, pin, credential, allowed)
                for mode in ("positive", "negative")
            ]
        # Without a credential the guard answers: fewer cases show all it does.
        out.append(
            Shard(operation, "positive", max(1, examples // 10), pins[0] if pins else (), None, allowed)
        )
        return out

    exp_pins = [(("id_or_name", name),) for name in ("fz-exp-draft", "fz-exp-running", "fz-exp-rollout")] + [
        (("id_or_name", resources["running_id"]),)
    ]
    return [
        *both("GET /v1/models", 50, credential="client"),
        *both("POST /v1/feedback", 700, credential="client"),
        *both("GET /healthz", 10),
        *both("GET /readyz", 10, allowed=(503,)),  # not ready: routes on unreachable upstreams
        *both("GET /metrics", 10),
        *both("GET /admin/upstreams", 100),
        *both("POST /admin/upstreams", 900),
        *both("GET /admin/upstreams/{name}", 200, (("name", "fz-up-read"),)),
        *both("PATCH /admin/upstreams/{name}", 500, (("name", "fz-up-patch"),)),
        *both("DELETE /admin/upstreams/{name}", 200, (("name", "fz-up-used"),), (("name", "fz-up-free"),)),
        *both("GET /admin/experiments", 100),
        *both("POST /admin/experiments", 700),
        *both("GET /admin/experiments/{id_or_name}", 200, *exp_pins[:2]),
        *both("PATCH /admin/experiments/{id_or_name}", 250, *exp_pins),
        *both("POST /admin/experiments/{id_or_name}/start", 100, *exp_pins[:2]),
        *both("POST /admin/experiments/{id_or_name}/pause", 100, *exp_pins[1:3]),
        *both("POST /admin/experiments/{id_or_name}/stop", 100, exp_pins[2]),
        *both("GET /admin/api-keys", 100),
        *both("POST /admin/api-keys", 300),
        *both("DELETE /admin/api-keys/{name}", 200, (("name", "fz-key"),)),
    ]


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # a few minutes in CI; more on a busy machine
def test_the_gateway_answers_every_generated_admin_and_public_request_below_500_in_time(
    service: Service, tmp_path: Path
) -> None:
    resources = _resources(service.url)
    status, document = http_json("GET", service.url + "/admin/openapi.json", ADMIN)
    assert status == 200 and isinstance(document, dict)
    target = Target(
        document,
        service.url,
        {
            "admin": {"Authorization": f"Bearer {ADMIN}"},
            "client": {"Authorization": f"Bearer {resources['client_key']}"},
        },
    )
    seed = run_seed()
    cpu0 = service.cpu_s()
    score, elapsed = run(target, _shards(resources), seed)
    summary = (
        score.summary("gateway (OpenAPI)", seed, elapsed) + f", gateway CPU {service.cpu_s() - cpu0:.0f} s"
    )
    print(summary)
    print("cases per operation:", dict(sorted(score.per_shard.items())))
    assert score.failed == 0, summary + "\n" + "\n".join(score.failures)
    assert score.cases >= MIN_CASES * scale(), summary
    assert service.alive(), service.log_text()[-3000:]
    assert "Traceback" not in service.log_text(), service.log_text()[-5000:]
