"""``liftgate simulate``: simulated users against any gateway, with a progress bar."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from liftgate.admin_client import resolve_gateway_url

if TYPE_CHECKING:
    from liftgate.traffic import TrafficConfig, TrafficRun, TrafficStats

console = Console(stderr=True)


def _parse_quality(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            q = float(value)
        except ValueError:
            q = -1.0
        if not sep or not name or not 0.0 <= q <= 1.0:
            raise typer.BadParameter(f"expected VARIANT=QUALITY with QUALITY in [0, 1], got {item!r}")
        out[name] = q
    return out


def summary_table(stats: TrafficStats) -> Table:
    table = Table(title=f"simulated traffic: {stats.requests} requests in {stats.elapsed():.0f} s")
    for col in ("variant", "requests", "errors", "up", "down", "regen", "copy", "rating"):
        table.add_column(col, justify="right" if col != "variant" else "left", no_wrap=True)
    for name, vs in sorted(stats.by_variant.items()):
        fb = vs.feedback
        table.add_row(
            name, str(vs.requests), str(vs.errors),
            *(str(fb.get(k, 0)) for k in ("thumbs_up", "thumbs_down", "regenerate", "copy", "rating")),
        )  # fmt: skip
    return table


def simulate(
    gateway: Annotated[
        str | None,
        typer.Option(
            help="Gateway base URL (default: what a running `liftgate up` recorded, else http://127.0.0.1:8080).",
            envvar="LIFTGATE_GATEWAY_URL",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", envvar="LIFTGATE_STATE_DIR", help="Where `liftgate up` keeps its state."),
    ] = None,
    route: Annotated[
        list[str] | None,
        typer.Option(help="Route(s) to call (repeat for several; conversations split evenly)."),
    ] = None,
    users: Annotated[
        int, typer.Option(min=1, max=1_000_000, help="Number of distinct simulated users.")
    ] = 100,
    duration: Annotated[float, typer.Option(min=0.1, help="Stop after this many seconds.")] = 60.0,
    rate: Annotated[
        float, typer.Option(min=0.0, help="Requests per second over all users (0: as fast as possible).")
    ] = 10.0,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Conversations in flight at once.")] = 16,
    max_requests: Annotated[int | None, typer.Option(min=1, help="Stop after this many requests.")] = None,
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same user ids and behaviour.")] = 0,
    stream_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of requests that stream (SSE).")
    ] = 0.2,
    think_time: Annotated[
        float, typer.Option(min=0.0, help="Mean pause between turns of a conversation (s).")
    ] = 0.0,
    quality: Annotated[
        list[str] | None,
        typer.Option(help="VARIANT=Q fallback quality when responses carry none (real model servers)."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="LIFTGATE_API_KEY", help="Client API key, if required.")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar (for logs).")] = False,
) -> None:
    """Run simulated users (heavy and light users, multi-turn conversations, feedback) against a gateway."""
    from liftgate.traffic import TrafficConfig

    routes = route or ["assistant"]
    gateway = resolve_gateway_url(gateway, state_dir)
    base = TrafficConfig(gateway_url=gateway)
    configs = [
        TrafficConfig(
            gateway_url=gateway, route=r, users=users, duration_s=duration,
            max_requests=None if max_requests is None else max(1, max_requests // len(routes)),
            rate=(rate / len(routes)) or None, concurrency=max(1, concurrency // len(routes)), seed=seed,
            api_key=api_key, stream_share=stream_share, think_time_s=think_time,
            quality_by_variant=_parse_quality(quality or []), feedback=base.feedback,
        )
        for r in routes
    ]  # fmt: skip
    stats = asyncio.run(_run(configs, quiet))
    total = sum(s.requests for s in stats)
    for s in stats:
        console.print(summary_table(s))
    errors = sum(s.errors for s in stats)
    if total == 0:
        last = next((s.last_error for s in stats if s.last_error), "no request was made")
        console.print(f"[red]no successful traffic: {last}")
        raise typer.Exit(1)
    if errors == total:
        console.print(f"[red]every request failed; last error: {stats[0].last_error}")
        raise typer.Exit(1)


async def _run(configs: list[TrafficConfig], quiet: bool) -> list[TrafficStats]:
    duration = max(c.duration_s for c in configs)
    progress = Progress(
        TextColumn("[bold]simulating"), BarColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"), console=console, disable=quiet,
    )  # fmt: skip
    task = progress.add_task("traffic", total=duration, info="")
    from liftgate.traffic import TrafficRun

    runs: list[TrafficRun] = []

    def on_progress(_: TrafficStats) -> None:
        req = sum(r.stats.requests for r in runs)
        err = sum(r.stats.errors for r in runs)
        fb = sum(r.stats.feedback_sent for r in runs)
        progress.update(
            task, completed=runs[0].stats.elapsed(), info=f"{req} requests, {err} errors, {fb} feedback"
        )

    runs.extend(TrafficRun(c, on_progress) for c in configs)

    def stop_all() -> None:
        for r in runs:
            r.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_all)
    with progress:
        return list(await asyncio.gather(*(r.run() for r in runs)))
