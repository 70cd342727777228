"""Signing in to the dashboard, and out.

- ``GET /dashboard/login``: the form — a user's name and password, or (name left empty) a
  token: the admin token, the read token or a user's API token. With ``?ticket=…`` (a
  one-time link, printed by ``liftgate up``) it signs in as the bootstrap admin at once.
- ``POST /dashboard/login`` (form fields ``name``, ``password``, ``next``, ``csrf``): signs in
  and redirects. The form carries a CSRF token that must match the ``lg_login`` cookie set
  with the form (double submit), so another site cannot sign a browser in to its account.
  Failed sign-ins are counted per name (per client address for tokens): after
  ``LIFTGATE_LOGIN_MAX_FAILURES`` in a row the name is locked for
  ``LIFTGATE_LOGIN_LOCKOUT_S`` (429), even for the right password.
- ``POST /dashboard/logout`` (form field ``csrf``: the session's token): ends the session.

The session cookie (``lg_session``) is a random id whose SHA-256 is stored with the user, the
role and the session's CSRF token (:mod:`control.users`); it is ``HttpOnly``,
``SameSite=Lax`` (a link from a chat opens the dashboard signed in; another site's POST is
sent without it, and a change needs the CSRF token anyway) and ``Secure`` over HTTPS.
"""

from __future__ import annotations

import hmac
import html
import logging
import secrets
import urllib.parse
from typing import Annotated, Final

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from analytics.service.access import LOGIN_PATH, SESSION_COOKIE, Access, get_access
from control import users
from control.auth import Denied, fingerprint

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
MAX_FORM_BYTES: Final = 8192
LOGIN_CSRF_COOKIE: Final = "lg_login"
LOGOUT_PATH: Final = "/dashboard/logout"

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>liftgate — sign in</title><link rel="icon" href="data:,">
<style>
body {{ font: 15px/1.4 system-ui, sans-serif; margin: 0; display: grid; place-items: center; min-height: 100vh;
       background: #f5f6f8; color: #1d2330; }}
form {{ background: #fff; padding: 2rem; border-radius: 8px; box-shadow: 0 1px 4px #0002; width: min(26rem, 90vw); }}
h1 {{ font-size: 1.2rem; margin: 0 0 1rem; }} label {{ display: block; margin: .6rem 0 .3rem; }}
input[type=password], input[type=text] {{ width: 100%; box-sizing: border-box; padding: .5rem; font: inherit; }}
button {{ margin-top: 1rem; padding: .5rem 1.2rem; font: inherit; }} .error {{ color: #b42318; }}
.hint {{ color: #5b6474; font-size: .9rem; }}
</style></head><body>
<form method="post" action="{action}" id="login">
<h1>liftgate dashboard</h1>
{message}
<label for="name">User name</label>
<input type="text" id="name" name="name" autocomplete="username" autofocus>
<label for="password">Password (or, with no user name, a token)</label>
<input type="password" id="password" name="password" autocomplete="current-password" required>
<input type="hidden" name="next" value="{next}">
<input type="hidden" name="csrf" value="{csrf}">
<button type="submit">Sign in</button>
<p class="hint">Users are created with <code>liftgate users add NAME --role viewer|operator|admin</code>.
With no user name, the password field takes the read token, a user's API token or the admin token;
<code>liftgate up</code> prints a one-time link that signs you in directly.</p>
</form></body></html>"""


def _next(value: str | None) -> str:
    """Where to go after signing in: a dashboard path of this service only (no open redirect)."""
    if value and value.startswith("/dashboard") and not value.startswith("//") and "\\" not in value:
        return value
    return "/dashboard"


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _page(
    request: Request, status: int, next_path: str, message: str = "", headers: dict[str, str] | None = None
) -> HTMLResponse:
    """The form, with a fresh login CSRF token in the form and in its cookie."""
    csrf = secrets.token_urlsafe(24)
    body = _PAGE.format(
        action=html.escape(LOGIN_PATH),
        next=html.escape(next_path, quote=True),
        csrf=csrf,
        message=f'<p class="error" role="alert">{html.escape(message)}</p>' if message else "",
    )
    response = HTMLResponse(
        body, status_code=status, headers={"Cache-Control": "no-store", **(headers or {})}
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        csrf,
        max_age=3600,
        path=LOGIN_PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    return response


def _open(access: Access, who: users.Identity, basis: str) -> str:
    with access.auth.engine.begin() as conn:
        cookie, _ = users.open_session(conn, who, basis, access.session_ttl_s, users.utcnow())
    return cookie


def _signed_in(request: Request, next_path: str, cookie: str) -> Response:
    # One Set-Cookie only (the login form's CSRF cookie is left to expire: it grants nothing).
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=int(get_access(request).session_ttl_s),
        path="/",
        httponly=True,
        samesite="lax",
        secure=_secure(request),
    )
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get(LOGIN_PATH)
async def login_page(
    request: Request,
    ticket: Annotated[str | None, Query(max_length=200)] = None,
    next: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    target = _next(next)
    if ticket is None:
        return _page(request, 200, target)
    access = get_access(request)
    if await run_in_threadpool(access.redeem, ticket):
        admin = users.Identity(None, "admin", "admin")
        cookie = await run_in_threadpool(_open, access, admin, fingerprint(access.auth.admin_token))
        return _signed_in(request, target, cookie)
    return _page(
        request, 401, target, "This sign-in link is invalid, expired or already used; sign in below."
    )


async def _form(request: Request, fields: int) -> dict[str, str] | str:
    """The urlencoded form's first values, or why it cannot be read."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return "Send the form as application/x-www-form-urlencoded."
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        return "The form is too large."
    try:
        parsed = urllib.parse.parse_qs(raw.decode("utf-8", "replace"), max_num_fields=fields)
    except ValueError:
        return "Unexpected form fields."
    return {k: v[0] for k, v in parsed.items() if v}


def _check_credentials(
    access: Access, form: dict[str, str], client: str
) -> tuple[users.Identity, str] | int | str:
    """(who, session basis), or seconds to wait (locked out), or why signing in failed."""
    name = form.get("name", "").strip()
    secret = form.get("password") or form.get("token") or ""
    now = users.utcnow()
    with access.auth.engine.begin() as conn:
        if name:
            try:
                who = users.check_password(conn, name, secret, access.lockout, now)
            except users.LockedOut as exc:
                return exc.retry_after_s
            return (who, "user") if who is not None else "Wrong user name or password."
        subject = f"addr:{client}"
        wait = users.locked_for(conn, subject, now)
        if wait:
            return wait
    token = secret.strip()
    try:
        principal = access.auth.bearer(token) if token else None
    except Denied:
        principal = None
    with access.auth.engine.begin() as conn:
        if principal is None:
            users.record_failure(conn, subject, access.lockout, now)
            return "That token is not valid here."
        users.clear_failures(conn, subject)
    who = users.Identity(principal.user_id, principal.name, principal.role)
    return who, ("user" if principal.user_id is not None else fingerprint(token))


@router.post(LOGIN_PATH)
async def login(request: Request) -> Response:
    form = await _form(request, 8)
    if isinstance(form, str):
        return _page(
            request, 400 if "fields" in form else 415 if "urlencoded" in form else 413, "/dashboard", form
        )
    target = _next(form.get("next"))
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    sent = form.get("csrf", "")
    if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        return _page(
            request,
            403,
            target,
            "The sign-in form expired or came from another site (CSRF check); try again.",
        )
    access = get_access(request)
    client = request.client.host if request.client else "unknown"
    result = await run_in_threadpool(_check_credentials, access, form, client)
    if isinstance(result, int):
        log.warning("sign-in refused: locked out for %s s", result)
        message = f"Too many failed sign-ins; try again in {result} s."
        return _page(request, 429, target, message, {"Retry-After": str(result)})
    if isinstance(result, str):
        return _page(request, 401, target, result)
    who, basis = result
    cookie = await run_in_threadpool(_open, access, who, basis)
    return _signed_in(request, target, cookie)


def _logout(access: Access, cookie: str, sent: str) -> bool:
    """End the session if ``sent`` is its CSRF token (False: a forged sign-out)."""
    with access.auth.engine.begin() as conn:
        found = users.session_identity(conn, cookie, users.utcnow())
        if found is not None:
            csrf = found[0].csrf or ""
            if not sent or not hmac.compare_digest(sent.encode(), csrf.encode()):
                return False
        users.close_session(conn, cookie)
    return True


@router.post(LOGOUT_PATH)
async def logout(request: Request) -> Response:
    form = await _form(request, 4)
    sent = (form.get("csrf", "") if isinstance(form, dict) else "") or request.headers.get("x-csrf-token", "")
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and not await run_in_threadpool(_logout, get_access(request), cookie, sent):
        return HTMLResponse("Sign-out refused: CSRF token missing or wrong.", status_code=403)
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
