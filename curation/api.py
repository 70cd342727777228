"""The datasets HTTP API: a FastAPI router the analytics service mounts.

Built by :func:`make_router` with the service's engine getter and its credential checks
(passed in: curation never imports the service). Reads (list, show, replays) need the read
credential; everything that creates, exports or deletes data needs the admin one, and is
audited with the admin's name. Errors are 4xx with a reason: 400 bad input, 404 unknown
dataset or experiment, 409 an export that would leak a holdout (with the overlapping ids).

Exports stream: the body is written to a spooled temporary file (memory up to 8 MiB, then
disk) after the holdout check, and sent from there.

(No ``from __future__ import annotations`` here: FastAPI must see the route signatures'
dependency types, which are local to :func:`make_router`, as objects.)
"""

import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine

from curation import export as exporting
from curation import retention, source, store
from curation.builder import create_version
from curation.spec import CurationError, CurationSpec, NotFound
from curation.split import split as do_split

SPOOL_BYTES = 8 << 20


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    spec: dict[str, Any]
    description: str | None = Field(default=None, max_length=2000)
    ttl_days: int | None = Field(default=None, ge=1, le=retention.MAX_TTL_DAYS)


class SplitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int | None = Field(default=None, ge=1)
    holdout: float = Field(default=0.2, gt=0, lt=1)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)


class ReferenceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str
    kind: Literal["edit", "task_success", "rating"]
    text: str | None = None
    check: dict[str, Any] | None = None
    value: float | None = None


class RetentionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    experiment: str | None = None
    ttl_days: int | None = Field(default=None, ge=1, le=retention.MAX_TTL_DAYS)


def _http(exc: CurationError) -> HTTPException:
    if isinstance(exc, exporting.HoldoutLeak):
        return HTTPException(409, {"message": str(exc), "overlaps": exc.overlaps})
    return HTTPException(404 if isinstance(exc, NotFound) else 400, str(exc))


def _ref(name: str, version: int | None) -> str:
    return f"{name}@{version}" if version is not None else name


def make_router(get_engine: Callable[[Request], Engine], require_read: Callable[..., Any],
                require_admin: Callable[..., str]) -> APIRouter:  # fmt: skip
    router = APIRouter(prefix="/api")
    EngineDep = Annotated[Engine, Depends(get_engine)]
    Admin = Annotated[str, Depends(require_admin)]

    @router.get("/datasets", dependencies=[Depends(require_read)])
    def list_datasets(engine: EngineDep) -> list[dict[str, Any]]:
        with engine.connect() as conn:
            return store.datasets(conn)

    @router.post("/datasets", status_code=201)
    def create(engine: EngineDep, actor: Admin, body: CreateBody) -> dict[str, Any]:
        try:
            spec = CurationSpec.model_validate(body.spec)
        except ValidationError as exc:
            raise HTTPException(
                400, f"spec: {exc.errors(include_url=False, include_context=False)}"
            ) from None
        try:
            info = create_version(engine, body.name, spec, actor, body.description)
            if body.ttl_days:
                with engine.begin() as conn:
                    store.set_expiry(
                        conn, body.name, datetime.now(UTC) + timedelta(days=body.ttl_days), actor
                    )
        except CurationError as exc:
            raise _http(exc) from None
        return {"dataset": info.dataset, "version": info.version, "items": info.item_count,
                "content_hash": info.content_hash, "stats": info.stats}  # fmt: skip

    @router.get("/datasets/{name}", dependencies=[Depends(require_read)])
    def show(engine: EngineDep, name: str) -> dict[str, Any]:
        try:
            with engine.connect() as conn:
                return store.show(conn, name)
        except CurationError as exc:
            raise _http(exc) from None

    @router.get("/datasets/{name}/replays", dependencies=[Depends(require_read)])
    def replays(engine: EngineDep, name: str) -> list[dict[str, Any]]:
        """Stored offline replays of the dataset's versions (win rates, per category with Holm), newest first."""
        try:
            with engine.connect() as conn:
                return store.replays(conn, name)
        except CurationError as exc:
            raise _http(exc) from None

    @router.post("/datasets/{name}/split", status_code=201)
    def split(engine: EngineDep, actor: Admin, name: str, body: SplitBody) -> dict[str, Any]:
        try:
            info = do_split(engine, _ref(name, body.version), body.holdout, body.seed, actor)
        except CurationError as exc:
            raise _http(exc) from None
        return {
            "dataset": info.dataset,
            "version": info.version,
            "content_hash": info.content_hash,
            **info.stats,
        }

    @router.get("/datasets/{name}/export")
    def export(
        engine: EngineDep, actor: Admin, name: str,
        format: Annotated[Literal["chat", "preference", "eval"], Query()],
        version: Annotated[int | None, Query(ge=1)] = None,
        split: Annotated[Literal["eval", "holdout"] | None, Query()] = None,
    ) -> StreamingResponse:  # fmt: skip
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115  (closed by the stream)
        try:
            result = exporting.export(engine, _ref(name, version), format, spool, actor, split)
        except CurationError as exc:
            spool.close()
            raise _http(exc) from None
        spool.seek(0)

        def body() -> Iterator[bytes]:
            try:
                while chunk := spool.read(1 << 16):
                    yield chunk
            finally:
                spool.close()

        headers = {"X-Liftgate-Items": str(result.items), "X-Liftgate-Skipped": str(result.skipped),
                   "X-Liftgate-Content-SHA256": result.content_hash}  # fmt: skip
        return StreamingResponse(body(), media_type="application/jsonl", headers=headers)

    @router.delete("/datasets/{name}")
    def delete(engine: EngineDep, actor: Admin, name: str) -> dict[str, Any]:
        try:
            with engine.begin() as conn:
                return {"deleted": name, **store.delete(conn, name, actor)}
        except CurationError as exc:
            raise _http(exc) from None

    @router.post("/datasets/references", status_code=201)
    def reference(engine: EngineDep, actor: Admin, body: ReferenceBody) -> dict[str, Any]:
        try:
            with engine.begin() as conn:
                ref_id = store.add_reference(conn, body.request_id, body.kind, actor, text_=body.text,
                                             check=body.check, value=body.value)  # fmt: skip
        except CurationError as exc:
            raise _http(exc) from None
        return {"id": ref_id, "request_id": body.request_id, "kind": body.kind}

    @router.put("/retention")
    def set_retention(engine: EngineDep, actor: Admin, body: RetentionBody) -> dict[str, Any]:
        try:
            with engine.begin() as conn:
                scope = (
                    source.experiment(conn, body.experiment).id
                    if body.experiment
                    else retention.DEFAULT_SCOPE
                )
                retention.set_policy(conn, scope, body.ttl_days, actor)
                return {"policies": {str(k): v for k, v in retention.policies(conn).items()}}
        except CurationError as exc:
            raise _http(exc) from None

    return router
