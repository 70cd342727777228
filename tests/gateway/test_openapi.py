"""The gateway publishes an OpenAPI document of its admin API and public non-completion routes."""

from __future__ import annotations

from tests.gateway.conftest import ADMIN_TOKEN, MemorySink, get, start_gateway, static_source


def test_the_openapi_document_is_served_behind_the_admin_token() -> None:
    with start_gateway(MemorySink(), static_source([], [])) as g:
        assert get(g.url + "/admin/openapi.json").status_code == 401
        assert (
            get(
                g.url + "/admin/openapi.json", headers={"Authorization": "Bearer not-the-token-123"}
            ).status_code
            == 403
        )
        assert get(g.url + "/openapi.json").status_code == 404
        doc = get(g.url + "/admin/openapi.json", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] == "liftgate gateway"
    paths = doc["paths"]
    for path in (
        "/admin/upstreams",
        "/admin/upstreams/{name}",
        "/admin/experiments/{id_or_name}",
        "/admin/api-keys",
    ):
        assert path in paths
    assert {"/v1/feedback", "/v1/models", "/healthz", "/readyz", "/metrics"} <= paths.keys()
    assert "/admin/openapi.json" not in paths
    # The completion routes are served before FastAPI and are not described.
    assert "/v1/chat/completions" not in paths
    # Request bodies are typed (a fuzzer generates from these), admin routes declare the bearer scheme.
    feedback = paths["/v1/feedback"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert feedback["required"] == ["request_id", "kind"]
    create = paths["/admin/upstreams"]["post"]
    assert create["security"] == [{"HTTPBearer": []}]
    schema_ref = create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    upstream_in = doc["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert upstream_in["additionalProperties"] is False
    assert upstream_in["properties"]["max_connections"]["maximum"] == 100_000
