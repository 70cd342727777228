"""The admin API's dependencies: the control plane, a database session, and the caller's
role, checked by :func:`control.auth.denial` (the one role check)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from control import auth
from control.errors import ControlError
from control.plane import ControlPlane

# Declares the scheme in the OpenAPI document; the check itself is control.auth's.
_bearer = HTTPBearer(
    auto_error=False, description="LIFTGATE_ADMIN_TOKEN, a user's API token (lgu_…), or the read token"
)


def get_plane(request: Request) -> ControlPlane:
    plane: ControlPlane = request.app.state.control
    return plane


Plane = Annotated[ControlPlane, Depends(get_plane)]


def get_session(plane: Plane) -> Iterator[Session]:
    with Session(plane.engine, expire_on_commit=False) as session:
        yield session


Db = Annotated[Session, Depends(get_session)]


def principal(request: Request, plane: ControlPlane, need: auth.Role) -> auth.Principal:
    """The caller if their role allows ``need`` (resolved once per request: an earlier layer,
    the analytics request guard, may have resolved it already); else 401/403."""
    try:
        found: auth.Principal | None = request.scope.get(auth.SCOPE_KEY)
        if found is None:
            found = plane.auth.resolve(request.method, request.headers, request.cookies)
        refused = auth.denial(found, need)
    except auth.Denied as exc:
        refused = exc
    if refused is not None:
        headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
        raise ControlError(refused.status, refused.reason, headers)
    assert found is not None
    return found


def _needs(role: auth.Role) -> Callable[..., auth.Principal]:
    def dependency(
        request: Request, plane: Plane, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> auth.Principal:
        return principal(request, plane, role)

    dependency.__name__ = f"require_{role}"
    return dependency


require_viewer = _needs("viewer")
require_operator = _needs("operator")
require_admin = _needs("admin")

#: The caller, any role (reads of the experiments, ``/admin/me``).
Viewer = Annotated[auth.Principal, Depends(require_viewer)]
#: The caller, at least an operator (experiment, rollout and metric changes).
Operator = Annotated[auth.Principal, Depends(require_operator)]
#: The caller, an admin (users, upstreams, client API keys).
Admin = Annotated[auth.Principal, Depends(require_admin)]
