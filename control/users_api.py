"""The admin API's users: who may sign in, with which role, and their API tokens.

- ``GET /admin/me`` (any role): who the caller is, their role, and — for a browser
  session — the CSRF token its forms must send in ``X-CSRF-Token``;
- ``GET|POST /admin/users``, ``PATCH /admin/users/{name}`` (role, disabled, password);
- ``GET|POST /admin/users/{name}/tokens``, ``DELETE /admin/users/{name}/tokens/{label}``:
  API tokens for the CLI (a new token is in the answer once; only its hash is kept).

All but ``/admin/me`` need the admin role; every change is audited with the caller.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from control import users
from control.deps import Admin, Plane, Viewer

router = APIRouter()  # included by control.api under its /admin prefix

_Name = Annotated[str, Field(min_length=1, max_length=64)]
_Password = Annotated[str, Field(min_length=1, max_length=1024)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class UserIn(_In):
    name: _Name
    role: Annotated[str, Field(max_length=16)]
    password: _Password


class UserPatch(_In):
    role: Annotated[str, Field(max_length=16)] | None = None
    disabled: bool | None = None
    password: _Password | None = None


class TokenIn(_In):
    label: _Name = "cli"


@router.get("/me")
def me(who: Viewer) -> dict[str, Any]:
    return {
        "name": who.name,
        "role": who.role,
        "actor": who.actor,
        "user": who.user_id is not None,
        "csrf": who.csrf,
    }


@router.get("/users")
def list_users(who: Admin, plane: Plane) -> list[dict[str, Any]]:
    with plane.engine.connect() as conn:
        return users.list_users(conn)


@router.post("/users", status_code=201)
def create_user(body: UserIn, who: Admin, plane: Plane) -> dict[str, Any]:
    with plane.engine.begin() as conn:
        return users.create_user(conn, body.name, body.role, body.password, who.actor)


@router.patch("/users/{name}")
def update_user(name: str, body: UserPatch, who: Admin, plane: Plane) -> dict[str, Any]:
    with plane.engine.begin() as conn:
        return users.update_user(
            conn, name, who.actor, role=body.role, disabled=body.disabled, password=body.password
        )


@router.get("/users/{name}/tokens")
def list_tokens(name: str, who: Admin, plane: Plane) -> list[dict[str, Any]]:
    with plane.engine.connect() as conn:
        return users.list_tokens(conn, name)


@router.post("/users/{name}/tokens", status_code=201)
def create_token(name: str, body: TokenIn, who: Admin, plane: Plane) -> dict[str, Any]:
    with plane.engine.begin() as conn:
        return users.create_token(conn, name, body.label, who.actor)


@router.delete("/users/{name}/tokens/{label}")
def revoke_token(name: str, label: str, who: Admin, plane: Plane) -> dict[str, Any]:
    with plane.engine.begin() as conn:
        return users.revoke_token(conn, name, label, who.actor)
