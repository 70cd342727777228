"""scripts/kafka against a real broker of its own: its own port pair and state dir, so a
broker shared by the rest of the suite (or a developer) is never touched. The jars come
from the shared cache (`scripts/kafka fetch`), so no test downloads anything twice."""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)

with warnings.catch_warnings():
    # kafka-python 3.0 loads its protocol schemas through importlib.resources' deprecated
    # read_text at import time; the warning names importlib, so pyproject's kafka.* filter misses it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kafka"


@dataclass(frozen=True)
class Broker:
    env: dict[str, str]
    state: Path
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.state / "kafka" / "broker.pid"

    def pid(self) -> int:
        return int(self.pid_file.read_text())


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=240, check=False
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair() -> int:
    """A port p with p and p + 1 free (client and controller listeners)."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < 65534 and _bindable(port + 1):
            return port
    raise RuntimeError("no free port pair on 127.0.0.1")


def wait_gone(pid: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still alive after {timeout} s")


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    # scripts/test exports the shared broker's address; these tests must run their own.
    for name in ("LIFTGATE_KAFKA_BOOTSTRAP", "LIFTGATE_KAFKA_PORT", "KAFKA_HOME", "LIFTGATE_KAFKA_LIBS"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def libs() -> str:
    """The shared jar cache (fetched once, then reused by every state dir)."""
    return ok(run(base_env(), "fetch")).stdout.strip().splitlines()[-1]


def make_env(state: Path, port: int, libs: str) -> dict[str, str]:
    return {
        **base_env(),
        "LIFTGATE_STATE_DIR": str(state),
        "LIFTGATE_KAFKA_PORT": str(port),
        "LIFTGATE_KAFKA_LIBS": libs,
    }


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, libs: str) -> Iterator[Broker]:
    state = tmp_path_factory.mktemp("kafka-state")
    port = free_port_pair()
    started = Broker(env=make_env(state, port, libs), state=state, port=port)
    ok(run(started.env, "up"))
    yield started
    run(started.env, "down")


@pytest.fixture
def running(broker: Broker) -> Broker:
    """The module's broker, started again if an earlier test left it down."""
    ok(run(broker.env, "up"))
    return broker


def test_up_is_idempotent_and_keeps_the_running_broker(running: Broker) -> None:
    pid = running.pid()
    result = ok(run(running.env, "up"))
    assert result.stdout.strip() == running.bootstrap
    assert "already running" in result.stderr
    assert running.pid() == pid


def test_status_prints_the_address_of_the_running_broker(running: Broker) -> None:
    assert ok(run(running.env, "status")).stdout.strip() == running.bootstrap


def test_up_after_the_broker_was_killed_starts_a_new_one(running: Broker) -> None:
    old = running.pid()
    os.kill(old, signal.SIGKILL)
    wait_gone(old)
    assert run(running.env, "status").returncode == 1
    result = ok(run(running.env, "up"))
    assert "stale PID file" in result.stderr
    assert running.pid() != old
    ok(run(running.env, "status"))


def test_down_stops_the_broker_and_status_then_fails(running: Broker) -> None:
    pid = running.pid()
    ok(run(running.env, "down"))
    wait_gone(pid, timeout=1)
    assert not running.pid_file.exists()
    assert run(running.env, "status").returncode == 1


def test_a_pid_file_naming_an_unrelated_process_is_ignored(running: Broker) -> None:
    ok(run(running.env, "down"))
    running.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a broker: must not be killed
    result = ok(run(running.env, "up"))
    assert "stale PID file" in result.stderr
    assert running.pid() != os.getpid()


def test_up_reformats_a_data_dir_of_another_cluster(running: Broker) -> None:
    ok(run(running.env, "down"))
    meta = running.state / "kafka" / "data" / "meta.properties"
    meta.write_text(meta.read_text().replace("cluster.id=", "cluster.id=x"))
    result = ok(run(running.env, "up"))
    assert "wiping" in result.stderr
    ok(run(running.env, "status"))


def test_up_reformats_once_when_the_broker_dies_on_a_locked_data_dir(running: Broker) -> None:
    ok(run(running.env, "down"))
    # Kafka locks <log.dirs>/.lock with a POSIX record lock; hold it as a stale broker would.
    with (running.state / "kafka" / "data" / ".lock").open("a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = ok(run(running.env, "up"))
    assert "exited during startup" in result.stderr
    ok(run(running.env, "status"))


def test_topics_create_accepts_topics_that_already_exist(running: Broker) -> None:
    topic = f"exists-{secrets.token_hex(4)}"
    ok(run(running.env, "topics", "create", topic))
    result = ok(run(running.env, "topics", "create", topic, "--partitions", "2"))
    assert "already exists" in result.stderr


def test_topics_create_reports_an_invalid_name(running: Broker) -> None:
    result = run(running.env, "topics", "create", "not a topic!")
    assert result.returncode == 1
    assert "invalid" in result.stderr


def test_a_produced_message_is_consumed(running: Broker) -> None:
    topic = f"roundtrip-{secrets.token_hex(4)}"
    ok(run(running.env, "topics", "create", topic, "--partitions", "3"))
    producer = KafkaProducer(bootstrap_servers=running.bootstrap)
    try:
        producer.send(topic, key=b"unit-1", value=b"hello").get(timeout=30)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=running.bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
    )
    try:
        received: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while not received and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received += [(r.key, r.value) for r in records]
    finally:
        consumer.close()
    assert received == [(b"unit-1", b"hello")]


def test_up_refuses_a_port_held_by_another_process(tmp_path: Path, libs: str) -> None:
    port = free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = run(make_env(tmp_path, port, libs), "up")
    assert result.returncode == 1
    assert f"127.0.0.1:{port} is in use by another process" in result.stderr


def test_attach_mode_checks_the_named_broker_and_starts_nothing(tmp_path: Path, running: Broker) -> None:
    env = {
        **make_env(tmp_path, free_port_pair(), "/nonexistent"),
        "LIFTGATE_KAFKA_BOOTSTRAP": running.bootstrap,
    }
    assert ok(run(env, "up")).stdout.strip() == running.bootstrap
    ok(run(env, "status"))
    assert not (tmp_path / "kafka" / "broker.pid").exists()
    env["LIFTGATE_KAFKA_BOOTSTRAP"] = f"127.0.0.1:{free_port_pair()}"
    assert run(env, "up").returncode == 1
