"""``liftgate feedback import FILE.jsonl``: post recorded feedback to the gateway's ``/v1/feedback``.

Each line is one JSON object: ``{"request_id": "...", "kind": "thumbs_up", "value": 1}``
(``value`` optional, default 1; ``unit_id`` optional, sent as ``X-Liftgate-Unit``). Lines
are checked locally first; the gateway may still reject a line (a kind no metric or setting
declares, a value the kind does not allow). Every rejected line is reported with its number
and the reason, and the command exits 1.

A line the gateway accepts with a warning — a request id it has not served recently
(``unknown_request_id``) — is reported too (number and warning) and counted in the summary;
it is stored, and counted for a variant only if its interaction is stored (the analytics
service's ``GET /api/data-quality`` counts what never joins). Old feedback naturally refers
to calls the gateway no longer remembers, so warnings alone exit 0; ``--strict`` makes them
exit 1 as well.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from liftgate.admin_client import resolve_gateway_url

if TYPE_CHECKING:
    import aiohttp

app = typer.Typer(help="Import user feedback collected elsewhere.", no_args_is_help=True)
err = Console(stderr=True)

MAX_KIND = 256


@dataclass(frozen=True, slots=True)
class Line:
    number: int
    body: dict[str, Any]
    unit_id: str | None


@dataclass(frozen=True, slots=True)
class Rejected:
    number: int
    reason: str


@dataclass(frozen=True, slots=True)
class Warned:
    number: int
    reason: str


@dataclass(slots=True)
class Outcome:
    rejected: list[Rejected]
    warned: list[Warned]
    meanings: dict[str, str]  # warning code -> the gateway's explanation (printed once)


def parse_line(number: int, text: str) -> Line | Rejected:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return Rejected(number, f"not JSON ({exc.msg})")
    if not isinstance(data, dict):
        return Rejected(number, "not a JSON object")
    request_id, kind = data.get("request_id"), data.get("kind")
    if not isinstance(request_id, str) or not request_id:
        return Rejected(number, "missing 'request_id'")
    if not isinstance(kind, str) or not kind or len(kind) > MAX_KIND:
        return Rejected(number, "missing or invalid 'kind'")
    value = data.get("value")
    if value is None:
        # No value: the gateway decides what it means per kind (a yes/no signal is 1); a rating
        # is a value, so one without is an error here as at the gateway, never a silent 1.
        if kind == "rating":
            return Rejected(number, "'value' is required for kind 'rating'")
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return Rejected(number, f"'value' must be a finite number, got {value!r}")
    unit = data.get("unit_id")
    if unit is not None and not isinstance(unit, str):
        return Rejected(number, "'unit_id' must be a string")
    body = {k: v for k, v in data.items() if k != "value"}
    if value is not None:
        body["value"] = float(value)
    return Line(number, body, unit)


def read_lines(path: Path) -> tuple[list[Line], list[Rejected]]:
    good: list[Line] = []
    bad: list[Rejected] = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            parsed = parse_line(number, text)
            (good if isinstance(parsed, Line) else bad).append(parsed)  # type: ignore[arg-type]
    return good, bad


def _warnings(raw: bytes) -> dict[str, str]:
    """The warnings of an accepted line: code -> message (empty when there are none)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    found = data.get("warnings") if isinstance(data, dict) else None
    if not isinstance(found, list):
        return {}
    return {
        str(w.get("code") or "warning"): str(w.get("message") or "") for w in found if isinstance(w, dict)
    }


def _reason(status: int, raw: bytes) -> str:
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return f"HTTP {status}: {data['error'].get('message')}"
        if isinstance(data, dict) and "detail" in data:
            return f"HTTP {status}: {data['detail']}"
    except ValueError:
        pass
    return f"HTTP {status}: {raw[:200].decode(errors='replace')}"


async def post_all(
    gateway: str, lines: list[Line], *, api_key: str | None, concurrency: int, progress: Progress
) -> Outcome:
    import aiohttp

    task = progress.add_task("import", total=len(lines))
    rejected: list[Rejected] = []
    warned: list[Warned] = []
    meanings: dict[str, str] = {}
    sem = asyncio.Semaphore(concurrency)
    url = gateway.rstrip("/") + "/v1/feedback"

    async def one(session: aiohttp.ClientSession, line: Line) -> None:
        headers = {"Content-Type": "application/json"}
        if line.unit_id:
            headers["X-Liftgate-Unit"] = line.unit_id
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        async with sem:
            try:
                async with session.post(url, data=json.dumps(line.body), headers=headers) as resp:
                    raw = await resp.read()
                    if resp.status >= 300:
                        rejected.append(Rejected(line.number, _reason(resp.status, raw)))
                    elif warnings := _warnings(raw):
                        warned.append(Warned(line.number, ", ".join(sorted(warnings))))
                        meanings.update(warnings)
            except (aiohttp.ClientError, TimeoutError) as exc:
                rejected.append(Rejected(line.number, f"{type(exc).__name__}: {exc}"))
        progress.advance(task)

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(session, line) for line in lines))
    return Outcome(rejected, warned, meanings)


@app.command("import")
def import_(
    file: Annotated[
        Path, typer.Argument(help="JSONL file: one feedback object per line.", exists=True, dir_okay=False)
    ],
    gateway: Annotated[
        str | None,
        typer.Option(
            envvar="LIFTGATE_GATEWAY_URL",
            help="Gateway base URL (default: what a running `liftgate up` recorded, else http://127.0.0.1:8080).",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", envvar="LIFTGATE_STATE_DIR", help="Where `liftgate up` keeps its state."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="LIFTGATE_API_KEY", help="Client API key, if required.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Requests in flight.")] = 16,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 also when a line was accepted with a warning.")
    ] = False,
) -> None:
    """Post every line of FILE to /v1/feedback; report rejected lines and lines accepted with a
    warning (unknown request id); exit 1 if any was rejected (or, with --strict, warned)."""
    good, bad = read_lines(file)
    progress = Progress(
        TextColumn("[bold]feedback"), BarColumn(), MofNCompleteColumn(), console=err, transient=False
    )
    with progress:
        outcome = asyncio.run(
            post_all(
                resolve_gateway_url(gateway, state_dir),
                good,
                api_key=api_key,
                concurrency=concurrency,
                progress=progress,
            )
        )
    accepted = len(good) - len(outcome.rejected)
    bad += outcome.rejected
    bad.sort(key=lambda r: r.number)
    warned = sorted(outcome.warned, key=lambda w: w.number)
    for r in bad[:100]:
        err.print(f"line {r.number}: rejected: {r.reason}", markup=False, highlight=False, soft_wrap=True)
    if len(bad) > 100:
        err.print(f"... and {len(bad) - 100} more rejected lines")
    for w in warned[:100]:
        err.print(f"line {w.number}: warning: {w.reason}", markup=False, highlight=False, soft_wrap=True)
    if len(warned) > 100:
        err.print(f"... and {len(warned) - 100} more lines with warnings")
    for code, meaning in sorted(outcome.meanings.items()):
        err.print(f"{code}: {meaning}", markup=False, highlight=False, soft_wrap=True)
    err.print(f"{accepted} accepted ({len(warned)} with warnings), {len(bad)} rejected")
    if bad or (strict and warned):
        raise typer.Exit(1)
