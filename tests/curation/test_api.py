"""The datasets API router, mounted in a FastAPI app served by uvicorn (real HTTP, real
PostgreSQL): reads need the read credential, changes and exports the admin one; errors are
4xx with a reason; a leaking export is a 409 with the overlapping ids."""

from __future__ import annotations

import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from sqlalchemy import Engine

from curation.api import make_router
from tests.curation.data import Call, experiment, store_calls
from tests.curation.test_builder import _prompt

ADMIN, READER = "admin-" + secrets.token_hex(8), "reader-" + secrets.token_hex(8)


def _token(request: Request) -> str:
    return request.headers.get("authorization", "").removeprefix("Bearer ")


def _read(request: Request) -> str:
    if _token(request) not in (ADMIN, READER):
        raise HTTPException(401, "a read or admin token is required")
    return "reader"


def _admin(request: Request) -> str:
    if _token(request) != ADMIN:
        raise HTTPException(403 if _token(request) == READER else 401, "the admin token is required")
    return "admin:test"


@pytest.fixture(scope="module")
def api(engine: Engine) -> Iterator[str]:
    def get_engine(request: Request) -> Engine:
        return engine

    app = FastAPI()
    app.include_router(make_router(get_engine, _read, _admin))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", loop="asyncio", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "API server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(15)
    sock.close()


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Reply:
    def __init__(self, status: int, headers: Any, content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content
        self.text = content.decode(errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


class Client:
    """A tiny HTTP client over urllib (no extra dependency)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def request(
        self, method: str, path: str, json: Any = None, headers: dict[str, str] | None = None
    ) -> Reply:
        data = None if json is None else orjson.dumps(json)
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return Reply(resp.status, resp.headers, resp.read())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.headers, exc.read())

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Reply:
        return self.request("POST", path, **kw)

    def put(self, path: str, **kw: Any) -> Reply:
        return self.request("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> Reply:
        return self.request("DELETE", path, **kw)


def test_the_api_creates_shows_splits_exports_and_deletes_with_the_right_credentials(
    engine: Engine, api: str
) -> None:
    exp = experiment(engine)
    store_calls(engine, exp, [Call(_prompt(900 + i), category="code", feedback=("thumbs_down",), minutes=i)
                              for i in range(20)])  # fmt: skip
    body = {"name": "api-set", "spec": {"experiment": exp, "feedback": ["thumbs_down"]}, "ttl_days": 30}
    c = Client(api)
    if True:  # one client for the whole conversation
        assert c.post("/api/datasets", json=body).status_code == 401
        assert c.post("/api/datasets", json=body, headers=_h(READER)).status_code == 403
        made = c.post("/api/datasets", json=body, headers=_h(ADMIN))
        assert made.status_code == 201, made.text
        assert made.json()["items"] == 20
        assert c.get("/api/datasets").status_code == 401
        listed = c.get("/api/datasets", headers=_h(READER)).json()
        assert [d["name"] for d in listed] == ["api-set"] and listed[0]["expires_at"] is not None
        assert c.get("/api/datasets/nope", headers=_h(READER)).status_code == 404
        assert c.get("/api/datasets/nope/replays", headers=_h(READER)).status_code == 404
        assert c.get("/api/datasets/api-set/replays").status_code == 401
        assert c.get("/api/datasets/api-set/replays", headers=_h(READER)).json() == []  # none yet
        split = c.post("/api/datasets/api-set/split", json={"holdout": 0.25, "seed": 1}, headers=_h(ADMIN))
        assert split.status_code == 201 and split.json()["holdout"] == 5
        assert c.get("/api/datasets/api-set/export?format=eval", headers=_h(READER)).status_code == 403
        out = c.get("/api/datasets/api-set/export?format=eval", headers=_h(ADMIN))
        assert out.status_code == 200 and out.headers["X-Liftgate-Items"] == "15"
        assert len([orjson.loads(line) for line in out.content.splitlines()]) == 15
        bad = c.get("/api/datasets/api-set/export?format=csv", headers=_h(ADMIN))
        assert bad.status_code == 422
        again = c.post(
            "/api/datasets", json={"name": "api-all", "spec": {"experiment": exp}}, headers=_h(ADMIN)
        )
        assert again.status_code == 201
        leak = c.get("/api/datasets/api-all/export?format=chat", headers=_h(ADMIN))
        assert leak.status_code == 409
        assert len(leak.json()["detail"]["overlaps"]) == 5
        bad_spec = c.post(
            "/api/datasets", json={"name": "x", "spec": {"experiment": exp, "sample": 0}}, headers=_h(ADMIN)
        )
        assert bad_spec.status_code == 400 and "sample" in bad_spec.text
        no_exp = c.post(
            "/api/datasets", json={"name": "x", "spec": {"experiment": "nope"}}, headers=_h(ADMIN)
        )
        assert no_exp.status_code == 404
        ref = c.post("/api/datasets/references", json={"request_id": "r1", "kind": "rating", "value": 3},
                     headers=_h(ADMIN))  # fmt: skip
        assert ref.status_code == 201
        assert c.put("/api/retention", json={"ttl_days": 90}, headers=_h(ADMIN)).json() == {
            "policies": {"0": 90}
        }
        assert c.put("/api/retention", json={"ttl_days": None}, headers=_h(ADMIN)).json() == {"policies": {}}
        gone = c.delete("/api/datasets/api-all", headers=_h(ADMIN))
        assert gone.status_code == 200 and gone.json()["items"] == 20
        assert c.delete("/api/datasets/api-all", headers=_h(ADMIN)).status_code == 404
