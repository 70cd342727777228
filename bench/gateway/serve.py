"""Benchmark launcher: the real gateway app with a seeded in-memory config.

Route ``fake`` runs a running A/B experiment (control and candidate both on ``--upstream``,
50/50, ``fallback_to_control`` on); client key ``sk-bench-1234`` is required (its SHA-256 is
in the snapshot, so the auth path is exercised). ``--shadow-sleep-ms N`` turns the
experiment into a shadow one: it starts a second fake upstream that sleeps N ms and mirrors
``--shadow-rate`` of the requests to it. ``--judge-url URL --judge-rate R`` turns the judge
sampler on (task categories are always assigned, with the built-in rules);
``--content-logging hashed --ngram-rate R`` hashes the n-grams of a share R of the responses
(gateway.ngrams, with a random key). ``--arm-models A,B`` names the models the two arms ask the
upstream for (default: both ``fake``, the route's own name, so blinding has nothing to rewrite;
other names make every answer's ``model`` be rewritten to the route, as in a real experiment).
Events go to Kafka when ``--kafka`` is given and
``gateway.kafka_sink`` exists, otherwise to a null sink (say so when reporting numbers).

  python -m bench.gateway.serve --port 9000 --upstream http://127.0.0.1:18000/v1 [--kafka 127.0.0.1:19092]
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import logging
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvicorn

from gateway.__main__ import make_sink
from gateway.app import create_app
from gateway.config_source import StaticConfigSource
from gateway.null_sink import NullSink
from gateway.routing import key_hash
from gateway.server import uvicorn_options
from gateway.settings import GatewaySettings
from gateway.snapshot import ExperimentConfig, UpstreamConfig, VariantConfig, build_snapshot

FAKE_UPSTREAM = Path("/work/shared/bench/gateway-overhead/fake_upstream.py")
BENCH_KEY = "sk-bench-1234"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # uvicorn re-raises SIGTERM after shutdown, so atexit never runs: let the kernel stop the child.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_sleeper(delay_ms: int) -> str:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE_UPSTREAM),
            "--port",
            str(port),
            "--tokens",
            "16",
            "--delay-ms",
            str(delay_ms),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    atexit.register(proc.terminate)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("shadow upstream did not start")


def seeded_snapshot(
    upstream: str,
    shadow_url: str | None,
    shadow_rate: float,
    content_logging: str = "none",
    arm_models: tuple[str, str] = ("fake", "fake"),
) -> StaticConfigSource:
    upstreams = [UpstreamConfig(name="fake-upstream", base_url=upstream, max_connections=1000)]
    variants = [
        VariantConfig("control", "fake-upstream", arm_models[0], weight=50, is_control=True),
        VariantConfig("candidate", "fake-upstream", arm_models[1], weight=50),
    ]
    mode = "ab"
    if shadow_url is not None:
        upstreams.append(
            UpstreamConfig(name="sleepy", base_url=shadow_url, timeout_s=30, max_connections=1000)
        )
        variants[1] = VariantConfig("candidate", "sleepy", arm_models[1], weight=0)
        mode = "shadow"
    exp = ExperimentConfig(
        id=1,
        name="bench-ab",
        route="fake",
        mode=mode,
        status="running",
        salt="bench",
        variants=tuple(variants),
        fallback_to_control=True,
        shadow_sample_rate=shadow_rate,
        content_logging=content_logging,
    )
    snap = build_snapshot([exp], upstreams, frozenset({key_hash(BENCH_KEY)}), version="bench-1")
    return StaticConfigSource(snap)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--upstream", default="http://127.0.0.1:18000/v1")
    ap.add_argument("--kafka", default=None, help="bootstrap servers; events to Kafka")
    ap.add_argument("--shadow-sleep-ms", type=int, default=0)
    ap.add_argument("--shadow-rate", type=float, default=1.0)
    ap.add_argument("--judge-url", default=None, help="an OpenAI-compatible judge; off without it")
    ap.add_argument("--judge-model", default="judge")
    ap.add_argument("--judge-rate", type=float, default=0.0, help="share of primary responses judged")
    ap.add_argument("--content-logging", default="none", choices=["none", "hashed", "full"])
    ap.add_argument(
        "--ngram-rate", type=float, default=0.0, help="share of responses n-gram hashed (hashed logging)"
    )
    ap.add_argument("--arm-models", default="fake,fake", help="control,candidate upstream model names")
    a = ap.parse_args()
    control_model, _, candidate_model = a.arm_models.partition(",")
    if not control_model or not candidate_model:
        ap.error("--arm-models needs two names: CONTROL,CANDIDATE")
    logging.basicConfig(level=logging.WARNING)
    settings = GatewaySettings(
        admin_token=secrets.token_urlsafe(24),
        kafka_bootstrap=a.kafka,
        port=a.port,
        shadow_concurrency=64,
        spool_dir=tempfile.mkdtemp(prefix="liftgate-bench-spool-"),
        client_keys="required",
        # The load generator is one client sending up to 32 requests at once from one address.
        client_max_concurrency=1024,
        judge_url=a.judge_url,
        judge_model=a.judge_model,
        judge_sample_rate=a.judge_rate,
        ngram_key=secrets.token_urlsafe(24) if a.ngram_rate > 0 else None,
        ngram_sample_rate=a.ngram_rate,
    )
    sink = make_sink(settings) if a.kafka else NullSink()
    client = getattr(getattr(sink, "bus", None), "name", "-")
    print(f"bench gateway: sink={type(sink).__name__} kafka client={client}", file=sys.stderr)
    shadow_url = start_sleeper(a.shadow_sleep_ms) if a.shadow_sleep_ms > 0 else None
    source = seeded_snapshot(
        a.upstream, shadow_url, a.shadow_rate, a.content_logging, (control_model, candidate_model)
    )
    app = create_app(settings, sink, config_source=source)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=a.port,
        lifespan="on",
        **{**uvicorn_options(settings), "log_level": "warning"},
    )


if __name__ == "__main__":
    main()
