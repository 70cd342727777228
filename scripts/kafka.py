#!/usr/bin/env python3
"""A real local Apache Kafka broker (KRaft, one combined broker+controller node).

Used by tests, CI and developers; stdlib only, so it runs before the virtualenv exists.

    scripts/kafka fetch                      fetch the broker jars from Maven Central (cached)
    scripts/kafka up [--port N]              start the broker (idempotent) and print its address
    scripts/kafka down                       stop it
    scripts/kafka status                     exit 0 and print the address if it answers, else exit 1
    scripts/kafka topics create NAME... [--partitions N]

Environment:
    LIFTGATE_STATE_DIR         state root (default <repo>/.liftgate); the broker lives in <state>/kafka
    LIFTGATE_KAFKA_VERSION     Kafka version to fetch (default 4.1.1)
    LIFTGATE_KAFKA_PORT        client port (default 19092); the controller listens on port + 1
    LIFTGATE_KAFKA_PARTITIONS  partitions for `topics create` (default 6)
    LIFTGATE_KAFKA_BOOTSTRAP   host:port of an existing broker: attach to it, start nothing
    LIFTGATE_KAFKA_LIBS        a directory of Kafka jars to run from (no fetch)
    KAFKA_HOME                 an unpacked Apache Kafka distribution: run from $KAFKA_HOME/libs (no fetch)
    JAVA_HOME                  the Java 17+ to use (default: `java` on PATH)

The address goes to stdout (`BOOTSTRAP=$(scripts/kafka up)`); progress and errors go to stderr.

Note: this file must not `import kafka` (kafka-python): scripts/ is sys.path[0] when it
runs, so that name resolves to this very file.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import kafka_wire

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VERSION = "4.1.1"
DEFAULT_PORT = 19092
DEFAULT_PARTITIONS = 6
# Kafka 4.x logs through SLF4J 1.7 + Log4j 2 (log4j-api/core are runtime deps of kafka_2.13);
# the SLF4J->Log4j2 binding is the one jar the Maven artifact does not bring. Same version as
# the log4j-core that kafka_2.13 4.1.x depends on.
LOG4J_BINDING = ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3")
NODE_ID = 1

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
FETCH_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
# Another invocation may hold the lock through a cold fetch plus a start.
LOCK_TIMEOUT_S = FETCH_TIMEOUT_S + 2 * START_TIMEOUT_S
POLL_S = 0.2

LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN" shutdownHook="disable">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="stdout"/></Root>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
  </Loggers>
</Configuration>
"""


class ScriptError(Exception):
    """A failure with a message for the user; no traceback."""


def say(message: str) -> None:
    print(f"kafka: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Layout:
    """Where everything lives under <state>/kafka."""

    root: Path

    @property
    def pom(self) -> Path:
        return self.root / "pom.xml"

    def libs(self, version: str) -> Path:
        return self.root / f"libs-{version}"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def format_stamp(self) -> Path:
        return self.root / "format.json"

    @property
    def server_properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def log4j_config(self) -> Path:
        return self.root / "log4j2.xml"

    @property
    def log(self) -> Path:
        return self.root / "broker.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def lock(self) -> Path:
        return self.root / "cli.lock"


@dataclass(frozen=True)
class Settings:
    layout: Layout
    version: str
    port: int
    partitions: int
    attach: str | None
    libs_override: Path | None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ScriptError(f"{name}={raw!r} is not an integer") from None


def settings_from_env(port: int | None = None, *, starting: bool = False) -> Settings:
    """Settings from the environment; `starting` is for `up`, which takes the port as requested."""
    state = Path(os.environ.get("LIFTGATE_STATE_DIR") or REPO / ".liftgate").resolve()
    libs_override = None
    if os.environ.get("LIFTGATE_KAFKA_LIBS"):
        libs_override = Path(os.environ["LIFTGATE_KAFKA_LIBS"]).resolve()
    elif os.environ.get("KAFKA_HOME"):
        libs_override = Path(os.environ["KAFKA_HOME"]).resolve() / "libs"
    layout = Layout(state / "kafka")
    if port is None and not starting:
        # A broker started earlier with --port keeps being found by status/down/topics.
        port = _configured_port(layout)
    if port is None:
        port = _env_int("LIFTGATE_KAFKA_PORT", DEFAULT_PORT)
    if not 0 < port < 65535:
        raise ScriptError(f"port {port} out of range (the controller needs port + 1 too)")
    return Settings(
        layout=layout,
        version=os.environ.get("LIFTGATE_KAFKA_VERSION") or DEFAULT_VERSION,
        port=port,
        partitions=_env_int("LIFTGATE_KAFKA_PARTITIONS", DEFAULT_PARTITIONS),
        attach=os.environ.get("LIFTGATE_KAFKA_BOOTSTRAP") or None,
        libs_override=libs_override,
    )


def _read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def _configured_port(layout: Layout) -> int | None:
    """The client port of the last broker `up` configured in this state dir, if any."""
    try:
        listeners = _read_properties(layout.server_properties).get("listeners", "")
    except OSError:
        return None
    for listener in listeners.split(","):
        port = listener.rsplit(":", 1)[-1]
        if listener.startswith("PLAINTEXT://") and port.isdigit():
            return int(port)
    return None


@contextlib.contextmanager
def cli_lock(layout: Layout) -> Iterator[None]:
    """Serialise fetch/up/down/topics on one state dir (parallel test workers, CI steps)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with layout.lock.open("a") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        waiting = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ScriptError(
                        f"another scripts/kafka command has held {layout.lock} too long"
                    ) from None
                if not waiting:
                    say("waiting for another scripts/kafka command to finish")
                    waiting = True
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------- jars


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise ScriptError("no `java` on PATH and no usable JAVA_HOME; Kafka 4.x needs Java 17+")
    return java


def _pom(version: str) -> str:
    group, artifact, binding_version = LOG4J_BINDING
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>liftgate.local</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{binding_version}</version>
    </dependency>
  </dependencies>
</project>
"""


def _check_libs(libs: Path) -> Path:
    if not any(libs.glob("kafka_2.*.jar")):
        raise ScriptError(f"{libs} holds no kafka_2.*.jar; is it a Kafka libs directory?")
    return libs


def ensure_libs(settings: Settings) -> Path:
    """The directory of broker jars, fetched with Maven once per version."""
    if settings.libs_override is not None:
        return _check_libs(settings.libs_override)
    layout = settings.layout
    libs = layout.libs(settings.version)
    marker = libs / ".complete"
    if marker.is_file():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ScriptError(
            "`mvn` not found; install Maven, or set KAFKA_HOME to an unpacked Kafka distribution"
        )
    say(f"fetching Apache Kafka {settings.version} jars from Maven Central into {libs}")
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.pom.write_text(_pom(settings.version))
    # Download into a side directory and rename, so an interrupted fetch never looks complete.
    partial = libs.with_name(libs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        mvn, "-q", "-B", "-f", str(layout.pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={partial}",
    ]  # fmt: skip
    started = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ScriptError(f"mvn did not finish within {FETCH_TIMEOUT_S:.0f} s") from None
    if result.returncode != 0:
        raise ScriptError(f"mvn failed (exit {result.returncode}):\n{_tail(result.stdout + result.stderr)}")
    jars = sorted(p.name for p in partial.glob("*.jar"))
    _check_libs(partial)
    (partial / ".complete").write_text("\n".join(jars) + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    say(f"fetched {len(jars)} jars in {time.monotonic() - started:.1f} s")
    return libs


# ---------------------------------------------------------------- processes


def _process_args(pid: int) -> str | None:
    """The command line of a live (not zombie) process, or None."""
    if Path("/proc/self").is_dir():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        # Field 3 is the state; the command name before it may contain spaces and parens.
        if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
            return None
        return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    result = subprocess.run(
        ["ps", "-ww", "-o", "stat=,args=", "-p", str(pid)], capture_output=True, text=True, timeout=10
    )
    stat, _, args = result.stdout.strip().partition(" ")
    return None if result.returncode != 0 or not stat or stat.startswith("Z") else args.strip()


def _all_pids() -> list[int]:
    if Path("/proc/self").is_dir():
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    result = subprocess.run(["ps", "-ax", "-o", "pid="], capture_output=True, text=True, timeout=10)
    return [int(line) for line in result.stdout.split()]


def _is_our_broker(pid: int, layout: Layout) -> bool:
    # _launch puts these two arguments last; an exact suffix, so /a/x never matches /b/a/x.
    args = _process_args(pid)
    return args is not None and args.endswith(f" kafka.Kafka {layout.server_properties}")


def _read_pid_file(layout: Layout) -> int | None:
    try:
        return int(layout.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def find_brokers(layout: Layout) -> list[int]:
    """PIDs of brokers running on this state dir: the PID file's, plus any that lost theirs."""
    recorded = _read_pid_file(layout)
    found = [recorded] if recorded is not None and _is_our_broker(recorded, layout) else []
    found += [pid for pid in _all_pids() if pid != recorded and _is_our_broker(pid, layout)]
    return found


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it happens to be our own child
        if _process_args(pid) is None:
            return True
        time.sleep(POLL_S)
    return _process_args(pid) is None


def stop(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if _wait_gone(pid, wait):
            return
        if sig == signal.SIGTERM:
            say(f"broker pid {pid} ignored SIGTERM for {timeout:.0f} s; sending SIGKILL")
    raise ScriptError(f"broker pid {pid} is still alive after SIGKILL")


# ---------------------------------------------------------------- broker


def answering_cluster(address: tuple[str, int], timeout: float = 2.0) -> kafka_wire.Cluster | None:
    """The cluster behind address if a Kafka broker there serves metadata, else None."""
    try:
        cluster = kafka_wire.metadata(address, [], timeout=timeout)
    except (OSError, kafka_wire.ProtocolError):
        return None
    # A KRaft broker lists itself only once it is registered and unfenced.
    return cluster if cluster.brokers else None


def _parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    addresses = []
    for item in bootstrap.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ScriptError(f"LIFTGATE_KAFKA_BOOTSTRAP item {item!r} is not host:port")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def _attached_address(bootstrap: str) -> tuple[str, int] | None:
    for address in _parse_bootstrap(bootstrap):
        if answering_cluster(address) is not None:
            return address
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_id(layout: Layout) -> str | None:
    try:
        return _read_properties(layout.data / "meta.properties").get("cluster.id")
    except OSError:
        return None


def _server_properties(settings: Settings) -> str:
    port, controller = settings.port, settings.port + 1
    return f"""# Generated by scripts/kafka.py on every `up`; edits are overwritten.
process.roles=broker,controller
node.id={NODE_ID}
controller.quorum.bootstrap.servers=127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs={settings.layout.data}

num.partitions=6
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
offsets.topic.replication.factor=1
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=6
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Small footprint: a dev/test broker holds little data.
num.network.threads=2
num.io.threads=4
log.segment.bytes=16777216
log.index.size.max.bytes=1048576
log.retention.hours=24
log.cleaner.dedupe.buffer.size=16777216
# After a SIGKILL the new incarnation can register only once the old session expires
# (default 9 s). Heartbeats stay on loopback inside one JVM, so 5 s is still generous.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=5000
"""


def _storage_problem(layout: Layout, controller_port: int) -> str | None:
    """Why the data dir cannot be used as is, or None if it is formatted for this config."""
    try:
        stamp = json.loads(layout.format_stamp.read_text())
        meta = _read_properties(layout.data / "meta.properties")
    except (OSError, ValueError) as exc:
        return f"unreadable format stamp or meta.properties ({exc.__class__.__name__})"
    if not isinstance(stamp, dict):
        return "malformed format stamp"
    if meta.get("cluster.id") != stamp.get("cluster_id"):
        return f"meta.properties cluster.id {meta.get('cluster.id')!r} != {stamp.get('cluster_id')!r}"
    if meta.get("node.id") != str(NODE_ID):
        return f"meta.properties node.id {meta.get('node.id')!r} != {NODE_ID}"
    if stamp.get("controller_port") != controller_port:
        # --standalone records the controller endpoint in the metadata log.
        return f"formatted for controller port {stamp.get('controller_port')}, now {controller_port}"
    return None


def _new_cluster_id() -> str:
    # Kafka's Uuid.randomUuid(): 16 random bytes, base64url without padding, never starting with '-'.
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


def _java_command(settings: Settings, libs: Path, *args: str) -> list[str]:
    return [
        _java(), f"-Dlog4j2.configurationFile={settings.layout.log4j_config}",
        "-cp", f"{libs}/*", *args,
    ]  # fmt: skip


def format_storage(settings: Settings, libs: Path, reason: str | None) -> None:
    layout = settings.layout
    if reason:
        say(f"wiping {layout.data}: {reason}")
    shutil.rmtree(layout.data, ignore_errors=True)
    layout.format_stamp.unlink(missing_ok=True)
    cluster_id = _new_cluster_id()
    command = _java_command(
        settings, libs, "kafka.tools.StorageTool", "format", "--standalone",
        "-t", cluster_id, "-c", str(layout.server_properties),
    )  # fmt: skip
    say(f"formatting storage (cluster id {cluster_id})")
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ScriptError(f"StorageTool format did not finish within {FORMAT_TIMEOUT_S:.0f} s") from None
    if result.returncode != 0:
        raise ScriptError(f"StorageTool format failed:\n{_tail(result.stdout + result.stderr)}")
    stamp = {"cluster_id": cluster_id, "controller_port": settings.port + 1, "version": settings.version}
    layout.format_stamp.write_text(json.dumps(stamp) + "\n")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _log_tail(layout: Layout) -> str:
    try:
        return _tail(layout.log.read_text(errors="replace"))
    except OSError:
        return "(no broker log)"


def _first_error(layout: Layout) -> str:
    try:
        lines = layout.log.read_text(errors="replace").splitlines()
    except OSError:
        return "no broker log"
    return next((line for line in lines if " ERROR " in line or "Exception" in line), "no error logged")


def _launch(settings: Settings, libs: Path) -> subprocess.Popen[bytes]:
    layout = settings.layout
    if layout.log.exists():
        layout.log.replace(layout.log.with_name("broker.log.1"))
    command = _java_command(
        settings, libs, "-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        "kafka.Kafka", str(layout.server_properties),
    )  # fmt: skip
    with layout.log.open("wb") as log:
        # A new session: the broker outlives this command and ignores the caller's Ctrl-C.
        process = subprocess.Popen(
            command, cwd=layout.root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    layout.pid_file.write_text(f"{process.pid}\n")
    return process


Outcome = Literal["ready", "exited", "timeout"]


def wait_ready(
    address: tuple[str, int], cluster_id: str | None, alive: Callable[[], bool], timeout: float
) -> Outcome:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster = answering_cluster(address)
        if cluster is not None and (cluster_id is None or cluster.cluster_id == cluster_id):
            return "ready"
        if not alive():
            return "exited"
        time.sleep(POLL_S)
    return "timeout"


def _launch_and_wait(settings: Settings, libs: Path, timeout: float) -> int | None:
    """Start the broker; None once it answers, else the exit code of a broker that died starting."""
    layout = settings.layout
    started = time.monotonic()
    process = _launch(settings, libs)
    say(f"started broker pid {process.pid}; waiting for {settings.bootstrap}")
    outcome = wait_ready(settings.address, _cluster_id(layout), lambda: process.poll() is None, timeout)
    if outcome == "ready":
        say(f"broker ready in {time.monotonic() - started:.1f} s (log: {layout.log})")
        return None
    layout.pid_file.unlink(missing_ok=True)
    if outcome == "timeout":
        stop(process.pid)
        raise ScriptError(f"broker not ready within {timeout:.0f} s; log tail:\n{_log_tail(layout)}")
    log = layout.log.read_text(errors="replace") if layout.log.exists() else ""
    if "Address already in use" in log:
        raise ScriptError(
            f"broker could not bind 127.0.0.1:{settings.port}/{settings.port + 1}; log tail:\n{_log_tail(layout)}"
        )
    return process.wait()


def _start(settings: Settings, libs: Path, timeout: float) -> None:
    layout = settings.layout
    layout.log4j_config.write_text(LOG4J2_XML)
    layout.server_properties.write_text(_server_properties(settings))
    fresh = not (layout.data.exists() and any(layout.data.iterdir()))
    problem = None if fresh else _storage_problem(layout, settings.port + 1)
    if fresh or problem:
        format_storage(settings, libs, problem)
    exit_code = _launch_and_wait(settings, libs, timeout)
    if exit_code is not None and not (fresh or problem):
        # Old data Kafka rejects (corrupt log, a foreign lock, version skew): start clean, once.
        format_storage(settings, libs, f"broker exited during startup: {_first_error(layout)}")
        exit_code = _launch_and_wait(settings, libs, timeout)
    if exit_code is not None:
        raise ScriptError(f"broker exited during startup (exit {exit_code}); log tail:\n{_log_tail(layout)}")


def up(settings: Settings, timeout: float) -> str:
    layout = settings.layout
    if settings.attach:
        address = _attached_address(settings.attach)
        if address is None:
            raise ScriptError(f"no Kafka broker answers at LIFTGATE_KAFKA_BOOTSTRAP={settings.attach}")
        say(f"attached to the broker at {address[0]}:{address[1]}")
        return settings.attach
    libs = ensure_libs(settings)
    running = find_brokers(layout)
    recorded = _read_pid_file(layout)
    if recorded is not None and recorded not in running:
        say(f"removing stale PID file (pid {recorded} is not a broker of {layout.root})")
        layout.pid_file.unlink()
    for pid in running:
        configured = _configured_port(layout)
        if configured != settings.port:
            raise ScriptError(f"a broker (pid {pid}) already runs on this state dir at port {configured}; "
                              "run `scripts/kafka down` first to move it")  # fmt: skip
        if recorded != pid:
            layout.pid_file.write_text(f"{pid}\n")
        alive = functools.partial(_is_our_broker, pid, layout)
        outcome = wait_ready(settings.address, _cluster_id(layout), alive, timeout)
        if outcome == "ready":
            say(f"already running (pid {pid})")
            return settings.bootstrap
        say(f"broker pid {pid} does not answer ({outcome}); restarting it")
        stop(pid)
        layout.pid_file.unlink(missing_ok=True)
    for port in (settings.port, settings.port + 1):
        if not _port_free(port):
            cluster = answering_cluster(("127.0.0.1", port), timeout=1.0)
            who = f"a Kafka broker of cluster {cluster.cluster_id}" if cluster else "another process"
            raise ScriptError(f"127.0.0.1:{port} is in use by {who}, not by the broker of {layout.root}; "
                              "stop it or pick another port (--port / LIFTGATE_KAFKA_PORT)")  # fmt: skip
    _start(settings, libs, timeout)
    return settings.bootstrap


def down(settings: Settings) -> None:
    if settings.attach:
        say("attached to an external broker (LIFTGATE_KAFKA_BOOTSTRAP); nothing to stop")
        return
    pids = find_brokers(settings.layout)
    for pid in pids:
        say(f"stopping broker pid {pid}")
        stop(pid)
    settings.layout.pid_file.unlink(missing_ok=True)
    if not pids:
        say("not running")


def status(settings: Settings) -> str | None:
    if settings.attach:
        address = _attached_address(settings.attach)
        return None if address is None else settings.attach
    for pid in find_brokers(settings.layout):
        cluster = answering_cluster(settings.address)
        if cluster is not None and cluster.cluster_id == _cluster_id(settings.layout):
            say(f"running (pid {pid})")
            return settings.bootstrap
        say(f"broker pid {pid} is alive but does not answer at {settings.bootstrap}")
        return None
    say("not running")
    return None


def create_topics(settings: Settings, names: list[str], partitions: int) -> None:
    if settings.attach:
        address = _attached_address(settings.attach)
        if address is None:
            raise ScriptError(f"no Kafka broker answers at LIFTGATE_KAFKA_BOOTSTRAP={settings.attach}")
    else:
        address = settings.address
    try:
        results = kafka_wire.create_topics(address, names, partitions)
    except (OSError, kafka_wire.ProtocolError) as exc:
        raise ScriptError(f"cannot create topics at {address[0]}:{address[1]}: {exc}") from None
    failures = []
    for result in results:
        if result.error_code == 0:
            say(f"created topic {result.name} ({partitions} partitions)")
        elif result.error_code == kafka_wire.TOPIC_ALREADY_EXISTS:
            say(f"topic {result.name} already exists")
        else:
            failures.append(f"{result.name}: error {result.error_code} {result.error_message or ''}".rstrip())
    if failures:
        raise ScriptError("could not create topics:\n" + "\n".join(failures))
    # Return only once every partition has a leader, so producers can use the topics at once.
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError, kafka_wire.ProtocolError):
            topics = kafka_wire.metadata(address, names).topics
            if all(name in topics and topics[name].ready for name in names):
                return
        if time.monotonic() > deadline:
            raise ScriptError(f"topics {', '.join(names)} have no partition leaders after 30 s")
        time.sleep(POLL_S)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripts/kafka", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="fetch the broker jars (cached per version)")
    up_parser = commands.add_parser("up", help="start the broker if needed; print its address")
    up_parser.add_argument("--port", type=int, help="client port (default LIFTGATE_KAFKA_PORT or 19092)")
    up_parser.add_argument("--timeout", type=float, default=START_TIMEOUT_S, help="readiness timeout, s")
    commands.add_parser("down", help="stop the broker")
    commands.add_parser("status", help="exit 0 and print the address if the broker answers")
    topics = commands.add_parser("topics", help="manage topics").add_subparsers(dest="action", required=True)
    create = topics.add_parser("create", help="create topics; existing ones are fine")
    create.add_argument("names", nargs="+", metavar="NAME")
    create.add_argument("--partitions", type=int, help="default LIFTGATE_KAFKA_PARTITIONS or 6")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = settings_from_env(getattr(args, "port", None), starting=args.command == "up")
        if args.command == "status":
            address = status(settings)
            if address is None:
                return 1
            print(address)
            return 0
        with cli_lock(settings.layout):
            if args.command == "fetch":
                print(ensure_libs(settings))
            elif args.command == "up":
                print(up(settings, args.timeout))
            elif args.command == "down":
                down(settings)
            else:
                create_topics(settings, args.names, args.partitions or settings.partitions)
    except ScriptError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
