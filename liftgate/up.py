"""``liftgate up``: the whole platform on the embedded default, in one command.

Starts PostgreSQL (embedded, data under the state dir), applies migrations, starts the
model simulator (baseline + candidate that differ in known ways) unless real upstreams
are given, the gateway and the analytics service; creates the demo experiments; prints
the URLs and the admin token; with ``--traffic`` adds simulated users. Ctrl-C stops
every process it started; the data stays for the next start.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml
from rich.console import Console

from liftgate.interrupt import StopSignals

if TYPE_CHECKING:
    from liftgate.stack import RunningStack

console = Console(stderr=True)
# The banner (URLs, token) goes to stdout and is never wrapped, so it can be copied or parsed.
banner_console = Console(soft_wrap=True)
log = logging.getLogger("liftgate.up")


def up(
    traffic: Annotated[
        bool, typer.Option("--traffic", help="Run simulated users against the demo routes.")
    ] = False,
    users: Annotated[int, typer.Option(min=1, max=100_000, help="Simulated users (with --traffic).")] = 200,
    rate: Annotated[
        float, typer.Option(min=0.1, help="Simulated requests per second, all routes (with --traffic).")
    ] = 20.0,
    traffic_duration: Annotated[
        float, typer.Option(min=1, help="Stop the simulated users after this many seconds (default 8 h).")
    ] = 8 * 3600.0,
    state_dir: Annotated[
        Path, typer.Option(envvar="LIFTGATE_STATE_DIR", help="Where data, logs and the admin token live.")
    ] = Path(".liftgate"),
    reset: Annotated[
        bool, typer.Option("--reset", help="Delete the stored data first (keeps the admin token).")
    ] = False,
    host: Annotated[str, typer.Option(help="Interface every service listens on.")] = "127.0.0.1",
    gateway_port: Annotated[
        int, typer.Option(min=1, max=65535, help="Gateway port (OpenAI API + admin).")
    ] = 8080,
    analytics_port: Annotated[
        int, typer.Option(min=1, max=65535, help="Analytics port (report API + dashboard).")
    ] = 8090,
    baseline_port: Annotated[
        int, typer.Option(min=1, max=65535, help="Simulated baseline model port.")
    ] = 8001,
    candidate_port: Annotated[
        int, typer.Option(min=1, max=65535, help="Simulated candidate model port.")
    ] = 8002,
    pg_port: Annotated[
        int, typer.Option(min=1, max=65535, envvar="LIFTGATE_PG_PORT", help="Embedded PostgreSQL port.")
    ] = 15432,
    database_url: Annotated[
        str | None,
        typer.Option(envvar="LIFTGATE_DATABASE_URL", help="Use this PostgreSQL instead of the embedded one."),
    ] = None,
    kafka: Annotated[
        str | None,
        typer.Option(
            "--kafka",
            envvar="LIFTGATE_KAFKA_BOOTSTRAP",
            help="Kafka bootstrap servers: events go gateway → Kafka → analytics consumer (default: in-process).",
        ),
    ] = None,
    no_simulator: Annotated[
        bool,
        typer.Option(
            "--no-simulator", help="Do not start the model simulator (give --upstream or --config)."
        ),
    ] = False,
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            help="A real model server NAME=URL (repeat; the first is the control). Replaces the simulator."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            help="YAML with 'upstreams:' and 'experiments:' to create instead of the demo.", exists=True
        ),
    ] = None,
    ready_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds each service may take to become ready.")
    ] = 90.0,
    log_level: Annotated[str, typer.Option(help="Log level of the services.")] = "info",
    scenario: Annotated[
        str | None,
        typer.Option(
            help="RL-risk scenario for the simulator: reward-hacking, forgetting, honest or biased-judge "
            "(baseline, candidate and a simulated judge; the gateway judges 25% of responses).",
        ),
    ] = None,
) -> None:
    """Start liftgate on the embedded default: PostgreSQL, simulator, gateway, analytics (Ctrl-C stops all)."""
    # Imported here so that `liftgate --help` and the other commands start fast.
    from contracts import redaction
    from liftgate import demo
    from liftgate.admin_client import AdminClient, AdminError
    from liftgate.experiment_file import load_experiment_file
    from liftgate.procs import StartupError
    from liftgate.stack import (
        StackOptions,
        UpstreamSpec,
        sign_in_url,
        start_offline_gate,
        start_stack,
        start_traffic,
    )

    # No secret in this process's logs: tokens are added once the stack has them.
    redaction.install(database_url=database_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        specs = tuple(UpstreamSpec.parse(u) for u in upstream or [])
        cfg_upstreams, cfg_experiments = load_experiment_file(config) if config else ([], [])
    except (ValueError, yaml.YAMLError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if no_simulator and not specs and not config:
        console.print("[red]error:[/red] --no-simulator needs --upstream NAME=URL or --config FILE")
        raise typer.Exit(2)
    if scenario is not None:
        from liftgate.scenarios import SCENARIOS

        if scenario not in SCENARIOS:
            console.print(f"[red]error:[/red] unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
            raise typer.Exit(2)
        if no_simulator or specs or config:
            console.print(
                "[red]error:[/red] --scenario runs the simulator: not with --no-simulator, --upstream or --config"
            )
            raise typer.Exit(2)
    stop = StopSignals()
    opts = StackOptions(
        state_dir=state_dir.resolve(), host=host, gateway_port=gateway_port, analytics_port=analytics_port,
        baseline_port=baseline_port, candidate_port=candidate_port, pg_port=pg_port, database_url=database_url,
        kafka_bootstrap=kafka or None, simulator=not no_simulator and not specs and not config,
        upstreams=specs, reset=reset, ready_timeout_s=ready_timeout, log_level=log_level, scenario=scenario,
        checkpoint=stop.checkpoint,
    )  # fmt: skip
    # SIGTERM (service managers) and SIGHUP (closed terminal) stop the stack like Ctrl-C.
    # SIGINT too, explicitly: a process started in the background by a non-interactive shell
    # inherits SIGINT *ignored*, and Python then installs no KeyboardInterrupt handler, so
    # `kill -INT` did nothing (seen: a test run launched from a background script waited
    # 60 s for a stack that never began to stop). Servers such as uvicorn do the same.
    # The signal becomes a KeyboardInterrupt in liftgate's own code only, never inside a
    # library (liftgate.interrupt); `stop.checkpoint()` raises it between steps.
    stop.install((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    stack: RunningStack | None = None
    code = 0
    try:
        console.print(f"starting liftgate (state in {opts.state_dir}) ...")
        stack = start_stack(opts)
        stop.checkpoint()
        client = AdminClient(stack.analytics_url, stack.admin_token)  # the control plane
        if config:
            demo.ensure_upstreams(client, cfg_upstreams)
            routes = demo.ensure_experiments(client, cfg_experiments)
        else:
            urls = stack.upstream_urls()
            routes = demo.seed(
                client, [demo.Upstream(n, url, demo.served_model(url, n)) for n, url in urls.items()]
            )
        gateway = AdminClient(stack.gateway_url, stack.admin_token)
        if not demo.wait_for_routes(gateway, routes, checkpoint=stop.checkpoint):
            console.print(f"[yellow]warning:[/yellow] the gateway does not serve all of {routes} yet")
        if opts.simulator and not opts.scenario:  # the offline gate knows the demo models only
            start_offline_gate(stack)
        if traffic:
            start_traffic(stack, users=users, rate=rate, routes=routes, duration_s=traffic_duration)
        stack.write_run_file()
        sign_in = sign_in_url(stack)
        stop.checkpoint()
        _banner(stack, routes, traffic, sign_in)
        code = _watch(stack, stop)
    except KeyboardInterrupt:
        console.print("\nstopping ...")
    except Exception as exc:
        if stop.received:  # a forced stop that surfaced inside a library, wrapped in its error
            console.print("\nstopping ...")
        elif isinstance(exc, (StartupError, AdminError, RuntimeError)):
            console.print(f"[red]error:[/red] {exc}")
            code = 1
        else:
            raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        if stack is not None:
            stack.stop()
        console.print("liftgate stopped; data kept in " + str(opts.state_dir))
    raise typer.Exit(code)


#: Children that may finish on their own (exit 0) without stopping the stack.
ONE_SHOT = {
    "traffic": "simulated traffic finished",
    "offline-gate": "offline gate decided for the demo candidate (liftgate eval show demo-gate)",
}


def _watch(stack: RunningStack, stop: StopSignals) -> int:
    """Run until interrupted; a service that dies stops the stack (the traffic child may finish)."""
    while True:
        stop.checkpoint()
        time.sleep(0.5)
        dead = stack.supervisor.first_dead()
        if dead is None:
            continue
        if dead.name in ONE_SHOT and dead.proc is not None and dead.proc.returncode == 0:
            console.print(f"{ONE_SHOT[dead.name]}; the platform keeps running (Ctrl-C stops it)")
            stack.supervisor.children.remove(dead)
            dead.stop()
            continue
        code = dead.proc.returncode if dead.proc else None
        console.print(f"[red]{dead.name} exited (code {code}); stopping.[/red]\n{dead.log_tail()}")
        return 1


def _banner(stack: RunningStack, routes: list[str], traffic: bool, sign_in: str) -> None:
    from liftgate.scenarios import SCENARIOS

    o = stack.options
    gw, an = stack.gateway_url, stack.analytics_url
    lines = [
        "",
        "[bold green]liftgate is up[/bold green]",
        f"  gateway (OpenAI API)  {gw}/v1      routes: {', '.join(routes)}",
        f"  dashboard             {sign_in}",
        "                        (one-time sign-in link as admin, valid 15 min; a new one: liftgate users link)",
        f"  report API            {an}/api/experiments  (Authorization: Bearer <read token>)",
        f"  metrics               {gw}/metrics  {an}/metrics  (Grafana: `docker compose up` — see docs/operations.md)",
        f"  admin token           {stack.admin_token}",
        f"                        (stored in {o.state_dir / 'admin_token'})",
        f"  read token            {stack.read_token}",
        f"                        (stored in {o.state_dir / 'read_token'}; reports and dashboard)",
        f"  events                {'Kafka at ' + o.kafka_bootstrap if o.kafka_bootstrap else 'in-process (Direct sink)'}",
        f"  logs                  {o.state_dir / 'logs'}",
        "",
        "  try:  liftgate report demo",
        (
            f"  scenario:  {o.scenario} — {SCENARIOS[o.scenario].summary} (a simulated judge scores 25% of responses)"
            if o.scenario
            else "        liftgate eval show demo-gate (offline gate: built-in suites, baseline vs candidate)"
        ),
        f"        curl {gw}/v1/chat/completions -H 'X-Liftgate-Unit: me' -H 'Content-Type: application/json' \\",
        f"             -d '{{\"model\": \"{routes[0] if routes else 'assistant'}\", \"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}]}}'",
        "  simulated users: " + ("running" if traffic else "off (add --traffic)"),
        "  Ctrl-C stops everything; data persists to the next start.",
    ]  # fmt: skip
    banner_console.print("\n".join(lines))
