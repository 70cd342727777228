"""What ``liftgate up`` runs: the embedded stack, described as data and started in order.

PostgreSQL (embedded, or any server named by a URL) → migrations → model simulator(s)
→ gateway → analytics → demo experiments → optional simulated users. Every service is a
``python -m ...`` child (see :mod:`liftgate.procs`), so stopping is one signal per group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from contracts import redaction
from eventbus import ClientChoice
from liftgate import db
from liftgate.admin_client import RUN_FILE
from liftgate.embedded_pg import EmbeddedPostgres
from liftgate.interrupt import no_checkpoint
from liftgate.procs import Child, Supervisor
from liftgate.scenarios import JUDGE_SAMPLE_RATE, scenario
from liftgate.simulator_model import SimulatorModel

log = logging.getLogger(__name__)

DATABASE_NAME = "liftgate"
TOKEN_FILE = "admin_token"
READ_TOKEN_FILE = "read_token"
NGRAM_KEY_FILE = "ngram_key"


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """A real model server given with ``--upstream name=url`` (or in a config file)."""

    name: str
    base_url: str
    model: str | None = None
    api_key: str | None = None

    @classmethod
    def parse(cls, text: str) -> UpstreamSpec:
        name, sep, url = text.partition("=")
        if not sep or not name.strip() or not url.strip().startswith(("http://", "https://")):
            raise ValueError(f"expected --upstream NAME=http(s)://HOST:PORT[/v1], got {text!r}")
        return cls(name=name.strip(), base_url=url.strip())


@dataclass(frozen=True, slots=True)
class StackOptions:
    state_dir: Path
    host: str = "127.0.0.1"
    gateway_port: int = 8080
    analytics_port: int = 8090
    baseline_port: int = 8001
    candidate_port: int = 8002
    pg_port: int = 15432
    database_url: str | None = None
    kafka_bootstrap: str | None = None
    kafka_client: ClientChoice = "auto"  # LIFTGATE_KAFKA_CLIENT of the gateway and analytics
    simulator: bool = True
    upstreams: tuple[UpstreamSpec, ...] = ()
    reset: bool = False
    ready_timeout_s: float = 90.0
    log_level: str = "info"
    #: An RL-risk scenario (liftgate.scenarios): its baseline, candidate and judge in one
    #: simulator process on baseline_port, and the gateway's judge sampler pointed at it.
    scenario: str | None = None
    #: Called between start-up steps and while waiting for services (``liftgate up``: raises
    #: KeyboardInterrupt once a stop signal arrived; liftgate.interrupt).
    checkpoint: Callable[[], None] = field(default=no_checkpoint, repr=False, compare=False)


@dataclass
class RunningStack:
    """What is up, for printing and for ``up.json`` (tests read the pids from it)."""

    options: StackOptions
    admin_token: str
    database_url: str
    read_token: str = ""
    supervisor: Supervisor = field(default_factory=Supervisor)
    pg: EmbeddedPostgres | None = None
    started_pg: bool = False
    pg_pid: int | None = None
    simulator_models: tuple[SimulatorModel, ...] = ()

    @property
    def gateway_url(self) -> str:
        return f"http://{self.options.host}:{self.options.gateway_port}"

    @property
    def analytics_url(self) -> str:
        return f"http://{self.options.host}:{self.options.analytics_port}"

    def upstream_urls(self) -> dict[str, str]:
        o = self.options
        if o.upstreams:
            return {u.name: u.base_url for u in o.upstreams}
        if o.scenario:  # one process serves both variants (and the judge)
            return {
                "baseline": f"http://{o.host}:{o.baseline_port}/v1",
                "candidate": f"http://{o.host}:{o.baseline_port}/v1",
            }
        return {
            "baseline": f"http://{o.host}:{o.baseline_port}/v1",
            "candidate": f"http://{o.host}:{o.candidate_port}/v1",
        }

    def write_run_file(self) -> None:
        data = {
            "pid": os.getpid(),
            "gateway": self.gateway_url,
            "analytics": self.analytics_url,
            "admin": self.analytics_url,  # the control plane's admin base URL (the CLI's)
            "children": {c.name: c.pid for c in self.supervisor.children},
            "postgres": {"port": self.pg.port, "started_here": self.started_pg} if self.pg else None,
        }
        (self.options.state_dir / RUN_FILE).write_text(json.dumps(data, indent=2))

    def stop(self) -> None:
        self.supervisor.stop_all()
        if self.pg is not None and self.started_pg:
            log.info("stopping embedded PostgreSQL")
            try:
                self.pg.stop()
            finally:
                _stop_postmaster(self.pg_pid, self.pg.data_dir)
        (self.options.state_dir / RUN_FILE).unlink(missing_ok=True)


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _stop_postmaster(pid: int | None, data_dir: Path, timeout_s: float = 30.0) -> None:
    """Make sure the server we started is gone, even when ``pg_ctl`` could not reach its data
    directory (e.g. a parent directory's permissions changed under us): SIGINT is
    PostgreSQL's fast shutdown, SIGQUIT its immediate one."""
    if pid is None:
        return
    try:
        proc = psutil.Process(pid)
        if str(data_dir) not in " ".join(proc.cmdline()):
            return  # not our postmaster (the pid was reused)
    except psutil.Error:
        return
    for sig in (signal.SIGINT, signal.SIGQUIT):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return
            proc.send_signal(sig)
            proc.wait(timeout_s)
            return
        except psutil.NoSuchProcess:
            return
        except psutil.TimeoutExpired:
            log.warning("PostgreSQL (pid %s) did not stop on signal %s", pid, sig)


def admin_token(state_dir: Path) -> str:
    """The stack's admin token: generated once (mode 0600) and reused on every later start."""
    return _secret(state_dir / TOKEN_FILE)


def read_token(state_dir: Path) -> str:
    """The stack's read token (reports, dashboard), kept like the admin token."""
    return _secret(state_dir / READ_TOKEN_FILE)


def ngram_key(state_dir: Path) -> str:
    """The key of the hashed n-grams (content logging ``hashed``), shared by the gateway and
    the analytics service: ``LIFTGATE_NGRAM_KEY`` when set, else generated once (mode 0600)
    and reused, so hashes stay comparable across restarts."""
    return os.environ.get("LIFTGATE_NGRAM_KEY") or _secret(state_dir / NGRAM_KEY_FILE)


def sign_in_url(stack: RunningStack) -> str:
    """A one-time link that signs a browser in to the dashboard as the bootstrap admin (valid 15 min)."""
    from analytics.service.access import login_ticket

    return f"{stack.analytics_url}/dashboard/login?ticket={login_ticket(stack.admin_token, stack.read_token)}"


def _secret(path: Path) -> str:
    if path.exists():
        token = path.read_text().strip()
        if len(token) >= 16:
            return token
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def reset_state(state_dir: Path, pg_port: int) -> None:
    """Delete the stack's data (PostgreSQL data, logs, spool); keeps the admin token."""
    pg = EmbeddedPostgres(data_dir=state_dir / "pg", port=pg_port)
    if pg.initialized():
        pg.stop()
    for name in ("pg", "logs", "spool"):
        shutil.rmtree(state_dir / name, ignore_errors=True)


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """The caller's environment (so any ``LIFTGATE_*`` tuning reaches the services), with
    what ``liftgate up`` decides on top; Kafka only when this stack runs in Kafka mode."""
    env = dict(os.environ)
    env.pop("LIFTGATE_KAFKA_BOOTSTRAP", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


#: Probability of a right answer per built-in eval category (see ``SimulatorModel.skills``).
DEMO_SKILLS = {
    "baseline": "math:0.65/code:0.85/json:0.85/instruction_following:0.80",
    "candidate": "math:0.90/code:0.45/json:0.85/instruction_following:0.80",
}


def demo_models() -> tuple[SimulatorModel, SimulatorModel]:
    """Baseline and candidate that differ in known ways (what the demo should reveal).

    Candidate: 20% more verbose (tokens 144 vs 120), ~15% slower, and a higher quality
    (0.66 vs 0.60), which simulated users turn into more thumbs-up and fewer regenerations.
    On the built-in eval suites it is better at math (90% vs 65%) and worse at code (45% vs
    85%): the offline gate blocks it for forgetting code.
    """
    baseline = SimulatorModel(
        name="baseline", latency_ms=300, latency_sd=80, ttft_ms=60, ttft_sd=15,
        tokens=120, tokens_sd=30, error_rate=0.005, quality=0.60, seed=1,
        skills=DEMO_SKILLS["baseline"],
    )  # fmt: skip
    candidate = SimulatorModel(
        name="candidate", latency_ms=345, latency_sd=90, ttft_ms=70, ttft_sd=18,
        tokens=144, tokens_sd=36, error_rate=0.005, quality=0.66, seed=2,
        skills=DEMO_SKILLS["candidate"],
    )  # fmt: skip
    return baseline, candidate


def _check_ports(opts: StackOptions) -> None:
    """Refuse early when a port is taken (a stale server answering /healthz would fool us),
    naming every busy port and the flag that moves each."""
    wanted = {"--gateway-port": opts.gateway_port, "--analytics-port": opts.analytics_port}
    if opts.simulator and not opts.upstreams:
        wanted["--baseline-port"] = opts.baseline_port
        if not opts.scenario:
            wanted["--candidate-port"] = opts.candidate_port
    pg_pid = _postmaster_pid(opts.state_dir / "pg")
    if not opts.database_url and not (pg_pid is not None and psutil.pid_exists(pg_pid)):
        # Our own PostgreSQL still running on this state dir is attached to, not a conflict.
        wanted["--pg-port"] = opts.pg_port
    busy = []
    for option, port in wanted.items():
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            s.settimeout(0.5)
            if s.connect_ex((opts.host, port)) == 0:
                busy.append(f"port {port} is in use: choose another with {option} PORT")
    if busy:
        raise RuntimeError(
            "; ".join(busy)
            + " (another `liftgate up`? `liftgate up --state-dir DIR` keeps a second one apart)"
        )


def start_stack(opts: StackOptions) -> RunningStack:
    """Start every service; on any failure stop what was started and re-raise."""
    _check_ports(opts)
    state = opts.state_dir
    state.mkdir(parents=True, exist_ok=True)
    if opts.reset:
        reset_state(state, opts.pg_port)
    token = admin_token(state)
    stack = RunningStack(
        options=opts,
        admin_token=token,
        database_url="",
        read_token=read_token(state),
        supervisor=Supervisor(checkpoint=opts.checkpoint),
    )
    redaction.remember(stack.admin_token, stack.read_token)
    try:
        _start_database(stack)
        opts.checkpoint()
        _start_services(stack)
    except BaseException:
        stack.stop()
        raise
    return stack


def _start_database(stack: RunningStack) -> None:
    opts = stack.options
    if opts.database_url:
        stack.database_url = opts.database_url
    else:
        pg = EmbeddedPostgres(data_dir=opts.state_dir / "pg", port=opts.pg_port, durable=True)
        stack.pg = pg
        # Attach to a server already running on this data dir; only stop what we start.
        stack.started_pg = not (pg.initialized() and pg.running())
        t0 = time.monotonic()
        pg.start()
        stack.pg_pid = _postmaster_pid(pg.data_dir) if stack.started_pg else None
        log.info("PostgreSQL ready on port %s in %.1f s", pg.port, time.monotonic() - t0)
        stack.database_url = pg.ensure_database(DATABASE_NAME)
    db.upgrade(stack.database_url)


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def _start_services(stack: RunningStack) -> None:
    opts = stack.options
    sup = stack.supervisor
    logs = opts.state_dir / "logs"
    key = ngram_key(opts.state_dir)
    redaction.remember(key)
    common = {
        "LIFTGATE_DATABASE_URL": stack.database_url,
        "LIFTGATE_ADMIN_TOKEN": stack.admin_token,
        "LIFTGATE_NGRAM_KEY": key,
        "LIFTGATE_STATE_DIR": str(opts.state_dir),
        "LIFTGATE_LOG_LEVEL": opts.log_level,
    }
    if opts.kafka_bootstrap:
        common["LIFTGATE_KAFKA_BOOTSTRAP"] = opts.kafka_bootstrap
        common["LIFTGATE_KAFKA_CLIENT"] = opts.kafka_client
        # The event topics, when missing (the broker does not auto-create them): the gateway's
        # own list (gateway.kafka_config.Topics.all), with the client the services will use.
        from eventbus import open_bus
        from gateway.kafka_config import ensure_topics

        ensure_topics(opts.kafka_bootstrap, bus=open_bus(opts.kafka_client))

    judge_env: dict[str, str] = {}
    if opts.simulator and not opts.upstreams and opts.scenario:
        sc = scenario(opts.scenario)
        stack.simulator_models = sc.models
        specs = [arg for model in sc.models for arg in ("--model", model.to_spec())]
        argv = _py("liftgate.simulator", "--host", opts.host, "--port", str(opts.baseline_port), *specs)
        sup.start(
            Child(
                "simulator", argv, _child_env({}), logs / "simulator.log",
                health_url=f"http://{opts.host}:{opts.baseline_port}/health",
            ),
            ready_timeout=opts.ready_timeout_s,
        )  # fmt: skip
        judge_env = {
            "LIFTGATE_JUDGE_URL": f"http://{opts.host}:{opts.baseline_port}/v1",
            "LIFTGATE_JUDGE_MODEL": sc.judge.name,
            "LIFTGATE_JUDGE_SAMPLE_RATE": str(JUDGE_SAMPLE_RATE),
        }
    elif opts.simulator and not opts.upstreams:
        models = demo_models()
        stack.simulator_models = models
        for model, port in zip(models, (opts.baseline_port, opts.candidate_port), strict=True):
            argv = _py(
                "liftgate.simulator", "--host", opts.host, "--port", str(port), "--model", model.to_spec()
            )
            child = Child(
                f"simulator-{model.name}", argv, _child_env({}), logs / f"simulator-{model.name}.log",
                health_url=f"http://{opts.host}:{port}/health",
            )  # fmt: skip
            sup.start(child, ready_timeout=opts.ready_timeout_s)

    # Direct sink (embedded default): the composition root wires analytics' ingest into the
    # gateway process. With Kafka the gateway runs on its own and analytics consumes.
    gateway_module = "gateway" if opts.kafka_bootstrap else "liftgate.gateway_direct"
    gateway_env = {
        **common,
        "LIFTGATE_HOST": opts.host,
        "LIFTGATE_PORT": str(opts.gateway_port),
        "LIFTGATE_SPOOL_DIR": str(opts.state_dir / "spool"),
        # The embedded stack is a local sandbox (127.0.0.1 by default, the simulated users send
        # no key): client keys are off unless the caller's environment asks for them.
        "LIFTGATE_CLIENT_KEYS": os.environ.get("LIFTGATE_CLIENT_KEYS", "off"),
        **judge_env,
    }
    sup.start(
        Child(
            "gateway", _py(gateway_module), _child_env(gateway_env), logs / "gateway.log",
            health_url=f"http://{opts.host}:{opts.gateway_port}/healthz",
        ),
        ready_timeout=opts.ready_timeout_s,
    )  # fmt: skip
    analytics_env = {
        **common,
        "LIFTGATE_READ_TOKEN": stack.read_token,
        "LIFTGATE_ANALYTICS_HOST": opts.host,
        "LIFTGATE_ANALYTICS_PORT": str(opts.analytics_port),
        # Demo: fresh numbers quickly.
        "LIFTGATE_SNAPSHOT_INTERVAL_S": os.environ.get("LIFTGATE_SNAPSHOT_INTERVAL_S", "10"),
        "LIFTGATE_REPORT_MAX_AGE_S": os.environ.get("LIFTGATE_REPORT_MAX_AGE_S", "10"),
    }
    sup.start(
        Child(
            "analytics", _py("analytics"), _child_env(analytics_env), logs / "analytics.log",
            health_url=f"http://{opts.host}:{opts.analytics_port}/healthz",
        ),
        ready_timeout=opts.ready_timeout_s,
    )  # fmt: skip


def start_traffic(
    stack: RunningStack, *, users: int, rate: float, routes: list[str], duration_s: float
) -> Child:
    """Simulated users as one more child (``liftgate simulate``), stopped with the rest."""
    opts = stack.options
    argv = _py("liftgate", "simulate", "--gateway", stack.gateway_url, "--users", str(users))
    # Enough conversations in flight to sustain the rate at the simulator's ~0.35 s latency.
    concurrency = max(16, min(512, int(rate)))
    argv += ["--rate", str(rate), "--duration", str(duration_s), "--concurrency", str(concurrency), "--quiet"]
    for route in routes:
        argv += ["--route", route]
    child = Child("traffic", argv, _child_env({}), opts.state_dir / "logs" / "traffic.log")
    stack.supervisor.start(child)
    return child


def start_offline_gate(stack: RunningStack) -> Child:
    """The demo's offline gate (``liftgate.demo_gate``) as a one-shot child: runs the built-in
    suites against both demo variants and records the gate decision."""
    env = _child_env({"LIFTGATE_DATABASE_URL": stack.database_url})
    child = Child(
        "offline-gate", _py("liftgate.demo_gate"), env, stack.options.state_dir / "logs" / "offline-gate.log"
    )
    stack.supervisor.start(child)
    return child
