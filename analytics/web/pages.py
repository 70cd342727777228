"""Routes of the dashboard: one HTML shell for every page, and its static assets.

The shell is the same document for the experiments list, an experiment page (with its
actions), its offline gate, examples and shadow-pair pages, the new-experiment form, the
settings page (upstreams, client keys, users) and the notifications page; the JavaScript reads
the path to decide what to draw. What a page may do is the API's decision: the pages call
``/admin`` with the session's CSRF token. Static files are served by a route (not a
``Mount``) so that ``router`` alone is enough to add the dashboard to an app.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

STATIC_DIR = Path(__file__).resolve().parent / "static"
_SHELL = STATIC_DIR / "index.html"
# Assets change with the package version only; the shell itself is never cached so a
# deployed upgrade is picked up on the next page load.
_ASSET_CACHE = "public, max-age=300"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".md": "text/markdown"}

router = APIRouter(include_in_schema=False)


def _shell() -> HTMLResponse:
    return HTMLResponse(_SHELL.read_text(encoding="utf-8"), headers={"Cache-Control": "no-cache"})


@router.get("/dashboard")
def experiments_page() -> HTMLResponse:
    return _shell()


@router.get("/dashboard/")
def experiments_page_slash() -> RedirectResponse:
    return RedirectResponse("/dashboard", status_code=308)


@router.get("/dashboard/new")
def new_experiment_page() -> HTMLResponse:
    return _shell()


@router.get("/dashboard/admin")
def settings_page() -> HTMLResponse:
    return _shell()


@router.get("/dashboard/experiments/{ref}")
def experiment_page(ref: Annotated[str, PathParam(min_length=1, max_length=128)]) -> HTMLResponse:
    # ref (id or name) is read by the page's script from the URL; the shell is static.
    return _shell()


@router.get("/dashboard/experiments/{ref}/offline-gate")
def offline_gate_page(ref: Annotated[str, PathParam(min_length=1, max_length=128)]) -> HTMLResponse:
    return _shell()


@router.get("/dashboard/notifications")
def notifications_page() -> HTMLResponse:
    return _shell()


@router.get("/dashboard/experiments/{ref}/examples")
def examples_page(ref: Annotated[str, PathParam(min_length=1, max_length=128)]) -> HTMLResponse:
    # Filters are the page's query string, read by its script and passed on to the API.
    return _shell()


@router.get("/dashboard/experiments/{ref}/shadow-pairs")
def shadow_pairs_page(ref: Annotated[str, PathParam(min_length=1, max_length=128)]) -> HTMLResponse:
    return _shell()


@router.get("/dashboard/static/{path:path}")
def static_asset(path: str) -> Response:
    target = (STATIC_DIR / path).resolve()
    # Refuse anything outside the static directory (``..`` tricks) or not a plain file.
    if not target.is_relative_to(STATIC_DIR) or not target.is_file():
        raise HTTPException(status_code=404, detail="not found")
    media = _TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    return FileResponse(target, media_type=media, headers={"Cache-Control": _ASSET_CACHE})


def mount(app: FastAPI) -> None:
    """Add the dashboard's routes to the analytics service's app."""
    app.include_router(router)
