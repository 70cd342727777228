"""Paired A/B of the gateway's CPU per request, for differences smaller than a shared box's noise.

``compare.sh`` runs one target at a time, so a load change between targets reads as a
difference between them. Here every checkout's ``serve.py`` is up at once (pinned alike:
gateways on ``--gateway-cpus``, fake upstream and load generator on ``--harness-cpus``), and
the targets are loaded in alternation (A B, B A, …) with the shared harness's ``load.py``;
each round's CPU per request is the gateway process group's utime+stime over the measured
requests (``load.py --watch``). Reported: medians, and the median of the per-round
differences against the first target.

  python -m bench.gateway.paired --scenario st-c32 --rounds 6 --n 3000 \\
      before=<checkout> after=<checkout> [--serve-args '--arm-models a,b']
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

HARNESS = Path("/work/shared/bench/gateway-overhead")
BENCH_KEY = "sk-bench-1234"


def _start(cmd: str, cpus: str, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["taskset", "-c", cpus, "bash", "-c", cmd],
        start_new_session=True,  # its own process group: load.py watches the group
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(proc)
    return proc


def _wait_ready(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"gateway on port {port} did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="NAME=CHECKOUT (a checkout with .venv); the first is the base")
    ap.add_argument("--scenario", default="ns-c1", help="ns-cK or st-cK")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--kafka", default="127.0.0.1:19092")
    ap.add_argument("--serve-args", default="", help="extra serve.py arguments for every target")
    ap.add_argument("--harness", type=Path, default=HARNESS)
    ap.add_argument("--python", default=str(Path.home() / ".cache/gateway-bench/venv/bin/python"))
    ap.add_argument("--harness-cpus", default="0")
    ap.add_argument("--gateway-cpus", default="1")
    ap.add_argument("--upstream-port", type=int, default=18761)
    ap.add_argument("--port", type=int, default=9761, help="first gateway port")
    a = ap.parse_args()
    targets = [t.split("=", 1) for t in a.targets]
    concurrency = int(a.scenario.split("-c")[1])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _start(
            f"exec {a.python} {a.harness / 'fake_upstream.py'} --port {a.upstream_port} --tokens 16",
            a.harness_cpus,
            procs,
        )
        gateways: dict[str, tuple[int, int]] = {}
        for i, (name, checkout) in enumerate(targets):
            port = a.port + i
            cmd = (
                f"cd {shlex.quote(checkout)} && exec .venv/bin/python -m bench.gateway.serve --port {port}"
                f" --upstream http://127.0.0.1:{a.upstream_port}/v1 --kafka {a.kafka} {a.serve_args}"
            )
            gateways[name] = (port, _start(cmd, a.gateway_cpus, procs).pid)
        for port, _ in gateways.values():
            _wait_ready(port)
        cpu: dict[str, list[float]] = {name: [] for name in gateways}
        names = list(gateways)
        for r in range(a.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                port, pgid = gateways[name]
                cmd = [
                    "taskset", "-c", a.harness_cpus, a.python, str(a.harness / "load.py"),
                    "--url", f"http://127.0.0.1:{port}", "--n", str(a.n), "--concurrency", str(concurrency),
                    "--api-key", BENCH_KEY, "--watch", f"gw={pgid}",
                    *(["--stream"] if a.scenario.startswith("st") else []),
                ]  # fmt: skip
                out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
                if out["n_err"]:
                    raise RuntimeError(f"{name}: errors {out['errors']}")
                cpu[name].append(out["server_cpu"]["gw"]["us_per_req"])
        load = [round(x, 1) for x in os.getloadavg()]
        print(json.dumps({"scenario": a.scenario, "n": a.n, "load_average": load, "us_per_request": cpu}))
        base = names[0]
        for name in names:
            diffs = [b - x for x, b in zip(cpu[base], cpu[name], strict=True)]
            print(
                f"{a.scenario} {name:12s} median {statistics.median(cpu[name]):6.1f} µs"
                f"  paired − {base}: median {statistics.median(diffs):+6.1f}, mean {statistics.mean(diffs):+6.1f}"
            )
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


if __name__ == "__main__":
    main()
