"""The runner against a real simulator and real PostgreSQL: results, cache, reuse, retries,
failures, resume after an interrupted ``liftgate eval run``."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

from sqlalchemy import Engine, text

from evals import store
from evals.datasets import load_dataset
from evals.datasets.loaders import Dataset
from evals.runner import RunnerSettings, RunSummary, run_experiment
from tests.evals.conftest import Arm, make_experiment

JSON_SUITE = load_dataset("json")
MATH_SUITE = load_dataset("math")


def run(engine: Engine, experiment: str, dataset: Dataset, **kw: object) -> list[RunSummary]:
    with engine.connect() as conn:
        exp = store.experiment(conn, experiment)
    settings = RunnerSettings(**kw)  # type: ignore[arg-type]
    return asyncio.run(run_experiment(engine, dataset, exp.targets, settings, experiment_id=exp.id))


def test_every_variant_is_called_and_each_result_is_stored(engine: Engine, simulator_url: str) -> None:
    name = make_experiment(
        engine, [Arm("baseline", "base", simulator_url, True), Arm("candidate", "cand", simulator_url)]
    )
    summaries = run(engine, name, JSON_SUITE)
    assert [s.status for s in summaries] == ["completed", "completed"]
    assert all(
        s.outputs == len(JSON_SUITE.items) and s.called == s.outputs and s.errors == 0 for s in summaries
    )
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT r.variant, count(*), count(*) FILTER (WHERE e.passed) FROM eval_results e"
            " JOIN eval_runs r ON r.id = e.run_id JOIN experiments x ON x.id = r.experiment_id"
            " WHERE x.name = :n GROUP BY r.variant ORDER BY r.variant"), {"n": name}).all()  # fmt: skip
    assert [(r[0], r[1]) for r in rows] == [("baseline", 54), ("candidate", 54)]
    assert all(30 <= r[2] <= 54 for r in rows)  # json skill 0.85


def test_a_rerun_reuses_the_completed_run_and_another_experiment_hits_the_output_cache(
    engine: Engine, simulator_url: str
) -> None:
    arms = [Arm("baseline", "base", simulator_url, True), Arm("candidate", "cand", simulator_url)]
    first = run(engine, make_experiment(engine, arms), MATH_SUITE)
    name = make_experiment(engine, arms)
    second = run(engine, name, MATH_SUITE)
    assert all(s.called == 0 and s.cached == len(MATH_SUITE.items) for s in second)
    assert [s.passed for s in second] == [s.passed for s in first]
    third = run(engine, name, MATH_SUITE)
    assert all(s.reused and s.called == 0 for s in third)
    fresh = run(engine, name, MATH_SUITE, fresh=True)
    assert all(not s.reused and s.called == len(MATH_SUITE.items) for s in fresh)


def test_transient_upstream_errors_are_retried(engine: Engine, simulator_url: str) -> None:
    name = make_experiment(engine, [Arm("baseline", "flaky", simulator_url, True)])
    (summary,) = run(engine, name, JSON_SUITE, retries=6, backoff_s=0.01)
    assert summary.errors == 0 and summary.outputs == len(JSON_SUITE.items)


def test_an_unreachable_upstream_gives_failed_calls_never_passes(engine: Engine, simulator_url: str) -> None:
    name = make_experiment(engine, [Arm("baseline", "base", "http://127.0.0.1:9/v1", True)])
    small = Dataset("json-small", "test", JSON_SUITE.items[:5])
    (summary,) = run(engine, name, small, retries=1, backoff_s=0.01)
    assert summary.status == "completed" and summary.errors == 5 and summary.passed == 0
    with engine.connect() as conn:
        reasons = conn.execute(text("SELECT reason FROM eval_results WHERE run_id = :r"),
                               {"r": summary.run_id}).scalars().all()  # fmt: skip
    assert all(r.startswith("call failed: gave up after 2 attempts") for r in reasons)


def test_an_unknown_model_is_an_error_not_a_retry(engine: Engine, simulator_url: str) -> None:
    name = make_experiment(engine, [Arm("baseline", "no-such-model", simulator_url, True)])
    small = Dataset("json-small", "test", JSON_SUITE.items[:3])
    started = time.monotonic()
    (summary,) = run(engine, name, small, retries=5, backoff_s=1.0)
    assert summary.errors == 3 and time.monotonic() - started < 5


def _sigint_as_at_a_terminal() -> None:
    # The test's process may ignore SIGINT (a CI started in the background, `cmd &` in a
    # non-interactive shell, or something earlier in the session), and a child inherits it:
    # Python keeps an ignored SIGINT ignored, so the interrupt below would never arrive.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str, database_url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LIFTGATE_DATABASE_URL": database_url}
    return subprocess.Popen([sys.executable, "-m", "liftgate", "eval", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_at_a_terminal)  # fmt: skip


def test_an_interrupted_run_resumes_where_it_stopped(
    engine: Engine, simulator_url: str, module_database_url: str
) -> None:
    name = make_experiment(engine, [Arm("baseline", "slow", simulator_url, True)])
    proc = _cli("run", "math", "--experiment", name, "--concurrency", "2", "--no-progress", "--json",
                database_url=module_database_url)  # fmt: skip
    query = text("SELECT count(*) FROM eval_results e JOIN eval_runs r ON r.id = e.run_id"
                 " JOIN experiments x ON x.id = r.experiment_id WHERE x.name = :n")  # fmt: skip
    deadline = time.monotonic() + 60
    stored = 0
    while time.monotonic() < deadline and stored < 8:
        time.sleep(0.1)
        with engine.connect() as conn:
            stored = conn.execute(query, {"n": name}).scalar_one()
    assert stored >= 8
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    with engine.connect() as conn:
        status = conn.execute(text("SELECT r.status FROM eval_runs r JOIN experiments x ON x.id = r.experiment_id"
                                   " WHERE x.name = :n"), {"n": name}).scalar_one()  # fmt: skip
        kept = conn.execute(query, {"n": name}).scalar_one()
    assert status == "interrupted" and kept >= stored
    again = _cli("run", "math", "--experiment", name, "--concurrency", "16", "--no-progress", "--json",
                 database_url=module_database_url)  # fmt: skip
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    (summary,) = [json.loads(line) for line in out.splitlines()]
    assert summary["status"] == "completed" and summary["outputs"] == 60
    assert summary["called"] == 60 - kept  # only what was missing was asked again


def test_two_processes_never_work_on_the_same_run(
    engine: Engine, simulator_url: str, module_database_url: str
) -> None:
    name = make_experiment(engine, [Arm("baseline", "slow", simulator_url, True)])
    first = _cli("run", "math", "--experiment", name, "--concurrency", "1", "--fresh", "--no-progress", "--json",
                 database_url=module_database_url)  # fmt: skip
    query = text(
        "SELECT count(*) FROM eval_runs r JOIN experiments x ON x.id = r.experiment_id WHERE x.name = :n"
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(query, {"n": name}).scalar_one():
                break
        time.sleep(0.1)
    second = _cli("run", "math", "--experiment", name, "--no-progress", database_url=module_database_url)
    _, err = second.communicate(timeout=60)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=30)
    assert second.returncode == 2
    assert "another process is running this eval" in err


class _Hostile(http.server.BaseHTTPRequestHandler):
    """An upstream that answers with a NUL byte, 20 MB, or not JSON, by model name."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body["model"]
        if model == "huge":
            payload = b'{"choices": [{"message": {"content": "' + b"x" * (20 << 20) + b'"}}]}'
        elif model == "garbage":
            payload = b"<html>oops</html>"
        else:
            payload = json.dumps({"choices": [{"message": {"content": "The answer is 5.\x00"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def test_nul_bytes_huge_and_malformed_replies_are_stored_or_refused_never_crash(engine: Engine) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        name = make_experiment(engine, [Arm("nul", "nul", url, True), Arm("huge", "huge", url),
                                        Arm("garbage", "garbage", url)])  # fmt: skip
        small = Dataset("math-small", "test", MATH_SUITE.items[:2])
        summaries = {s.variant: s for s in run(engine, name, small, retries=0)}
    finally:
        server.shutdown()
        thread.join(timeout=5)
    assert summaries["nul"].errors == 0 and summaries["nul"].outputs == 2
    assert summaries["huge"].errors == 2 and summaries["garbage"].errors == 2
    with engine.connect() as conn:
        rows: dict[str, str] = dict(conn.execute(text("SELECT r.variant, e.output || coalesce(e.error, '') FROM eval_results e"
                                      " JOIN eval_runs r ON r.id = e.run_id JOIN experiments x"
                                      " ON x.id = r.experiment_id WHERE x.name = :n"), {"n": name}).all())  # fmt: skip
        errors: dict[str, str] = dict(conn.execute(text("SELECT r.variant, e.error FROM eval_results e JOIN eval_runs r"
                                        " ON r.id = e.run_id JOIN experiments x ON x.id = r.experiment_id"
                                        " WHERE x.name = :n AND e.error IS NOT NULL"), {"n": name}).all())  # fmt: skip
    assert rows["nul"] == "The answer is 5.\ufffd"
    assert "larger than 16 MiB" in errors["huge"]
    assert "not a chat completion" in errors["garbage"]


def _runs_of(engine: Engine, name: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT r.variant, r.status FROM eval_runs r JOIN experiments x"
                                 " ON x.id = r.experiment_id WHERE x.name = :n ORDER BY r.variant"), {"n": name})  # fmt: skip
        return [(str(r[0]), str(r[1])) for r in rows]


def test_a_second_experiment_on_the_same_upstreams_gets_runs_of_its_own_from_the_cache(
    engine: Engine, simulator_url: str
) -> None:
    """Two experiments whose variants share upstream and model (the demo's `demo-gate` and
    `demo`): the second one's run was "reused" from the first one's, owned by the first, so its
    gate found no run of its own and failed ("no completed run ... (none)"). Each experiment
    now gets its own runs; the outputs and scores come from the cache (no call)."""
    arms = [Arm("baseline", "base", simulator_url, True), Arm("candidate", "cand", simulator_url)]
    first = make_experiment(engine, arms)
    run(engine, first, JSON_SUITE)
    second = f"{first}-2"
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO experiments (name, route, mode, salt) VALUES (:n, :n, 'ab', 's')"),
                     {"n": second})  # fmt: skip
        conn.execute(text("INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                          " SELECT (SELECT id FROM experiments WHERE name = :n), v.name, v.upstream_id, v.model,"
                          " v.weight, v.is_control FROM variants v JOIN experiments x ON x.id = v.experiment_id"
                          " WHERE x.name = :f"), {"n": second, "f": first})  # fmt: skip
    summaries = run(engine, second, JSON_SUITE)
    assert all(s.called == 0 and s.cached == len(JSON_SUITE.items) for s in summaries)
    assert _runs_of(engine, second) == [("baseline", "completed"), ("candidate", "completed")]
    assert _runs_of(engine, first) == [("baseline", "completed"), ("candidate", "completed")]


def test_two_variants_with_the_same_upstream_and_model_get_a_run_each(
    engine: Engine, simulator_url: str
) -> None:
    """An A/A test (`demo-aa`: the baseline and its copy): the copy reused the baseline's run,
    stored under the baseline's name, so the copy had none."""
    name = make_experiment(engine, [Arm("baseline", "base", simulator_url, True)])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                          " SELECT experiment_id, 'baseline-copy', upstream_id, model, weight, false FROM variants"
                          " WHERE experiment_id = (SELECT id FROM experiments WHERE name = :n)"), {"n": name})  # fmt: skip
    run(engine, name, JSON_SUITE)
    assert _runs_of(engine, name) == [("baseline", "completed"), ("baseline-copy", "completed")]
