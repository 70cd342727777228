"""Signing in to the dashboard: a session cookie from a token or a one-time sign-in link.

- ``GET /dashboard/login``: the form (a password field for the read or admin token);
  with ``?ticket=…`` (a one-time link, e.g. printed by ``liftgate up``) it signs in and
  redirects at once.
- ``POST /dashboard/login`` (form fields ``token``, ``next``): signs in and redirects.
- ``POST /dashboard/logout``: ends the session.

The cookie is ``HttpOnly``, ``SameSite=Strict`` (never sent by another site's request),
``Secure`` over HTTPS, and carries no token: a signed expiry (see ``analytics.service.access``).
It grants reads only; changes always need the admin token as a bearer header.
"""

from __future__ import annotations

import html
import urllib.parse
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from analytics.service.access import LOGIN_PATH, SESSION_COOKIE, get_access

router = APIRouter(include_in_schema=False)
MAX_FORM_BYTES = 4096

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>liftgate — sign in</title><link rel="icon" href="data:,">
<style>
body {{ font: 15px/1.4 system-ui, sans-serif; margin: 0; display: grid; place-items: center; min-height: 100vh;
       background: #f5f6f8; color: #1d2330; }}
form {{ background: #fff; padding: 2rem; border-radius: 8px; box-shadow: 0 1px 4px #0002; width: min(26rem, 90vw); }}
h1 {{ font-size: 1.2rem; margin: 0 0 1rem; }} label {{ display: block; margin-bottom: .4rem; }}
input[type=password] {{ width: 100%; box-sizing: border-box; padding: .5rem; font: inherit; }}
button {{ margin-top: 1rem; padding: .5rem 1.2rem; font: inherit; }} .error {{ color: #b42318; }}
.hint {{ color: #5b6474; font-size: .9rem; }}
</style></head><body>
<form method="post" action="{action}">
<h1>liftgate dashboard</h1>
{message}
<label for="token">Read token (or the admin token)</label>
<input type="password" id="token" name="token" autocomplete="current-password" required autofocus>
<input type="hidden" name="next" value="{next}">
<button type="submit">Sign in</button>
<p class="hint">The service's read token is <code>LIFTGATE_READ_TOKEN</code>; with <code>liftgate up</code> it is in
<code>.liftgate/read_token</code>, and the sign-in link it prints opens this dashboard directly.</p>
</form></body></html>"""


def _next(value: str | None) -> str:
    """Where to go after signing in: a dashboard path of this service only (no open redirect)."""
    if value and value.startswith("/dashboard") and not value.startswith("//") and "\\" not in value:
        return value
    return "/dashboard"


def _page(status: int, next_path: str, message: str = "") -> HTMLResponse:
    body = _PAGE.format(
        action=html.escape(LOGIN_PATH),
        next=html.escape(next_path, quote=True),
        message=f'<p class="error">{html.escape(message)}</p>' if message else "",
    )
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def _signed_in(request: Request, next_path: str) -> Response:
    access = get_access(request)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        access.new_session(),
        max_age=int(access.session_ttl_s),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get(LOGIN_PATH)
def login_page(
    request: Request,
    ticket: Annotated[str | None, Query(max_length=200)] = None,
    next: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    target = _next(next)
    if ticket is None:
        return _page(200, target)
    if get_access(request).redeem(ticket):
        return _signed_in(request, target)
    return _page(
        401, target, "This sign-in link is invalid, expired or already used; sign in with the token."
    )


@router.post(LOGIN_PATH)
async def login(request: Request) -> Response:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return _page(415, "/dashboard", "Send the form as application/x-www-form-urlencoded.")
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        return _page(413, "/dashboard", "The form is too large.")
    try:
        form = urllib.parse.parse_qs(raw.decode("utf-8", "replace"), max_num_fields=4)
    except ValueError:
        return _page(400, "/dashboard", "Unexpected form fields.")
    token = (form.get("token") or [""])[0].strip()
    target = _next((form.get("next") or [""])[0])
    if not token or get_access(request).role_of(token) is None:
        return _page(401, target, "That token is not valid here.")
    return _signed_in(request, target)


@router.post("/dashboard/logout")
def logout() -> Response:
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
