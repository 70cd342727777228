"""``liftgate eval score|run|gate|show|suites``: offline evals and the gate before any user sees a candidate.

``score`` needs no database and no model; ``run``, ``gate`` and ``show`` use the database
(``--database-url`` / ``LIFTGATE_DATABASE_URL``, default: the one ``liftgate up`` starts).
Exit codes: 0 done (``gate``: passed), 1 gate failed or a run did not complete, 2 bad input.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(help="Offline evals: score outputs, run suites against variants, gate candidates.",
                  no_args_is_help=True)  # fmt: skip
console = Console(soft_wrap=True)  # reasons stay on one line when piped
err = Console(stderr=True)

DbOpt = Annotated[str | None, typer.Option("--database-url", envvar="LIFTGATE_DATABASE_URL",
                                           help="SQLAlchemy URL (default: `liftgate up`'s embedded PostgreSQL).")]  # fmt: skip
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (one object per line) instead of tables.")]
FormatOpt = Annotated[
    str | None, typer.Option("--format", help="liftgate|gsm8k|humaneval|ifeval|openai (default: detected).")
]
WeakOpt = Annotated[bool, typer.Option("--allow-weak-sandbox",
                                       help="Run code tests even where the kernel refuses namespaces (rlimits and an audit hook only).")]  # fmt: skip
JudgeUrl = Annotated[
    str | None,
    typer.Option("--judge-url", envvar="LIFTGATE_JUDGE_URL", help="OpenAI-compatible judge server."),
]
JudgeModel = Annotated[
    str | None, typer.Option("--judge-model", envvar="LIFTGATE_JUDGE_MODEL", help="Judge model name.")
]
JudgeKey = Annotated[
    str | None, typer.Option("--judge-key", envvar="LIFTGATE_JUDGE_API_KEY", help="Judge API key.")
]


def _database_url(url: str | None) -> str:
    return (
        url
        or f"postgresql+psycopg://postgres@127.0.0.1:{os.environ.get('LIFTGATE_PG_PORT', '15432')}/liftgate"
    )


def _context(weak: bool, judge_url: str | None, judge_model: str | None, judge_key: str | None) -> Any:
    from evals.scorers import Endpoint, ScoringContext
    from evals.scorers.sandbox import SandboxLimits

    judge = Endpoint(judge_url, judge_model or "judge", judge_key) if judge_url else None
    return ScoringContext(sandbox=SandboxLimits(namespaces="try" if weak else "require"), judge=judge)


def _bad(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(_finite(obj), default=str) + "\n")


@app.command()
def score(
    dataset: Annotated[str, typer.Argument(help="A JSONL dataset file or a built-in suite name.")],
    outputs: Annotated[Path, typer.Option("--outputs", help='JSONL of {"id": ..., "output": "..."}.')],
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    workers: Annotated[
        int, typer.Option(min=1, max=64, help="Sandboxes at once (code items).")
    ] = os.cpu_count() or 2,
    weak: WeakOpt = False,
    judge_url: JudgeUrl = None,
    judge_model: JudgeModel = None,
    judge_key: JudgeKey = None,
) -> None:
    """Score given outputs against a dataset (no model call): one JSON object per output, then a summary."""
    from evals.datasets import DatasetError, load_dataset
    from evals.scoring import read_outputs, score_outputs, summarize

    try:
        data = load_dataset(dataset, fmt)
        scored = score_outputs(
            data, read_outputs(outputs), _context(weak, judge_url, judge_model, judge_key), workers
        )
    except DatasetError as exc:
        raise _bad(str(exc)) from None
    summary = summarize(scored)
    if as_json:
        for s in scored:
            _emit(s.to_json())
        _emit({"summary": summary})
        return
    table = Table(header_style="bold")
    for col in ("id", "category", "sample", "passed", "score", "reason"):
        table.add_column(col)
    for s in scored:
        mark = "[green]pass[/]" if s.score.passed else "[red]fail[/]"
        table.add_row(
            s.item_id, s.category, str(s.sample), mark, f"{s.score.score:.2f}", s.score.reason[:100]
        )
    console.print(table)
    console.print(f"{summary['passed']}/{summary['items']} items passed ({summary['pass_rate']:.1%}); "
                  + ", ".join(f"{c} {v['pass_rate']:.1%}" for c, v in summary["categories"].items())
                  + (f"; {summary['missing']} without output" if summary["missing"] else ""))  # fmt: skip
    if "pass_at_k" in summary:
        console.print(" ".join(f"{k} {v:.3f}" for k, v in summary["pass_at_k"].items()))


@app.command()
def run(
    suite: Annotated[
        str,
        typer.Argument(
            help="A built-in suite (math, code, instruction_following, json, demo), a JSONL file, or a "
            "production dataset as production:NAME[@VERSION] (replayed and judged pairwise)."
        ),
    ],
    experiment: Annotated[
        str, typer.Option("--experiment", help="Experiment name or id: every variant is evaluated.")
    ],
    fmt: FormatOpt = None,
    name: Annotated[
        str | None, typer.Option(help="Register a file dataset under this name (default: file stem).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, max=1024, help="Model calls in flight, all variants.")
    ] = 32,
    samples: Annotated[
        int | None, typer.Option(min=1, max=100, help="Samples per item (default: the gate's, else 1).")
    ] = None,
    retries: Annotated[int, typer.Option(min=0, max=10, help="Retries of a failed call.")] = 3,
    temperature: Annotated[
        float | None, typer.Option(min=0, max=2, help="Default: the gate's params, else 0.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Default: the gate's params, else 0.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="Default: the gate's params, else 1024.")
    ] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore stored results and cached outputs.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    as_json: JsonOpt = False,
    database_url: DbOpt = None,
    weak: WeakOpt = False,
    judge_url: JudgeUrl = None,
    judge_model: JudgeModel = None,
    judge_key: JudgeKey = None,
) -> None:
    """Run a suite against every variant of an experiment (cached, resumable) and store per-item results."""
    from curation import replay
    from evals import store
    from evals.datasets import DatasetError, load_dataset
    from evals.datasets.loaders import Dataset
    from evals.gate import GateParams, OfflineGate
    from evals.runner import RunnerSettings
    from liftgate import db

    production = replay.is_production(suite)
    if production and not judge_url:
        raise _bad("a production dataset is judged pairwise: give --judge-url (or LIFTGATE_JUDGE_URL)")
    engine = db.make_engine(_database_url(database_url))
    try:
        data = _production(engine, suite) if production else load_dataset(suite, fmt)
    except DatasetError as exc:
        engine.dispose()
        raise _bad(str(exc)) from None
    if name:
        data = Dataset(name, data.source, data.items)
    try:
        with engine.connect() as conn:
            exp = store.experiment(conn, experiment)
            stored = store.declaration(conn, exp.id)
        gate = OfflineGate.model_validate(stored) if stored else None
        base = gate.params if gate else GateParams()
        overrides = {k: v for k, v in (("temperature", temperature), ("seed", seed), ("max_tokens", max_tokens))
                     if v is not None}  # fmt: skip
        settings = RunnerSettings(
            params=base.model_copy(update=overrides), samples=samples or (gate.samples if gate else 1),
            concurrency=concurrency, retries=retries, fresh=fresh,
            scoring=_context(weak, judge_url, judge_model, judge_key), sandbox_workers=os.cpu_count() or 2,
        )  # fmt: skip
        summaries = _run_with_progress(engine, data, exp, settings, progress and not as_json)
        replays = (
            _replays(engine, data, exp, summaries, judge_url, judge_model, judge_key) if production else []
        )
    except KeyboardInterrupt:
        err.print("interrupted: results so far are stored; run the same command again to resume")
        raise typer.Exit(130) from None
    except store.StoreError as exc:
        raise _bad(str(exc)) from None
    except (ValidationError, ValueError) as exc:
        raise _bad(f"invalid offline_gate declaration: {exc}") from None
    finally:
        engine.dispose()
    for s in summaries:
        if as_json:
            _emit({"run_id": s.run_id, "variant": s.variant, "status": s.status, "reused": s.reused,
                   "outputs": s.outputs, "passed": s.passed, "errors": s.errors, "called": s.called,
                   "cached": s.cached, "seconds": round(s.seconds, 3)})  # fmt: skip
        else:
            rate = f"{s.passed / s.outputs:.1%}" if s.outputs else "—"
            how = "reused a completed run" if s.reused else f"{s.called} calls, {s.cached} from cache"
            console.print(f"{s.variant}: run {s.run_id} {s.status}, {s.passed}/{s.outputs} passed ({rate}), "
                          f"{s.errors} failed calls; {how}; {s.seconds:.1f} s")  # fmt: skip
    for r in replays:
        _render_replay(r, as_json)
    if any(s.status != "completed" or s.errors for s in summaries) or any(r.failed for r in replays):
        raise typer.Exit(1)


def _production(engine: Any, ref: str) -> Any:
    from curation import replay
    from curation.spec import CurationError
    from evals.datasets import DatasetError

    try:
        with engine.connect() as conn:
            return replay.load(conn, ref)
    except CurationError as exc:
        raise DatasetError(str(exc)) from None


def _replays(engine: Any, data: Any, exp: Any, summaries: list[Any], url: str | None, model: str | None,
             key: str | None) -> list[Any]:  # fmt: skip
    """Each candidate against the control, judged pairwise on the runs just made."""
    from curation import replay
    from evals.scorers import Endpoint

    runs = {s.variant: s.run_id for s in summaries}
    control = exp.control.variant
    judge = Endpoint(url or "", model or "judge", key)
    out = []
    for t in exp.candidates:
        if t.variant not in runs:
            continue
        result = asyncio.run(
            replay.pairwise(engine, data, (control, runs[control]), (t.variant, runs[t.variant]), judge)
        )
        # Stored with the dataset version: `liftgate datasets replays NAME`, GET /api/datasets/NAME/replays.
        replay.record(engine, data, exp.id, (runs[control], runs[t.variant]), judge, result,
                      f"cli:{getpass.getuser()}")  # fmt: skip
        out.append(result)
    return out


def _render_replay(r: Any, as_json: bool) -> None:
    if as_json:
        _emit({"replay": r.to_json()})
        return

    def pct(x: float | None) -> str:
        return "—" if x is None or math.isnan(x) else f"{x:.1%}"

    table = Table(
        header_style="bold", title=f"{r.candidate} vs {r.baseline}: pairwise, judged in both orders"
    )
    for col in ("category", "items", "win/tie/loss", "win rate [95% CI]", "p (Holm)", "LC win rate [95% CI]",
                "LC p (Holm)", "Δ length"):  # fmt: skip
        table.add_column(col)
    rows = [(c.category, c.result, c.p_holm, c.lc_p_holm) for c in r.categories]
    rows.append(("all", r.overall, r.overall.p_value, r.overall.lc_p_value))
    for name, w, p, lcp in rows:
        lc = (
            f"{pct(w.lc_rate)} [{pct(w.lc_low)}, {pct(w.lc_high)}]"
            if w.lc_rate is not None
            else (w.error or "—")
        )
        table.add_row(name, str(w.n), f"{w.wins}/{w.ties}/{w.losses}", f"{pct(w.rate)} [{pct(w.ci_low)}, {pct(w.ci_high)}]",
                      "—" if p is None else f"{p:.3g}", lc, "—" if lcp is None else f"{lcp:.3g}",
                      f"{w.mean_length_diff:+.0f} chars")  # fmt: skip
    console.print(table)
    if r.failed:
        console.print(
            f"[red]{r.failed} item(s) without both outputs were left out (rerun to retry them)[/red]"
        )


def _run_with_progress(engine: Any, data: Any, exp: Any, settings: Any, show: bool) -> list[Any]:
    from evals.runner import run_experiment

    total = len(data.items) * settings.samples
    if not show:
        return asyncio.run(run_experiment(engine, data, exp.targets, settings, experiment_id=exp.id))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err) as bar:
        tasks = {
            t.variant or t.model: bar.add_task(f"{data.name} · {t.variant}", total=total) for t in exp.targets
        }

        def advance(variant: str, n: int) -> None:
            bar.advance(tasks[variant], n)

        return asyncio.run(
            run_experiment(engine, data, exp.targets, settings, experiment_id=exp.id, progress=advance)
        )


def _load_declaration(path: Path) -> Any:
    from evals.gate import OfflineGate

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise _bad(f"cannot read {path}: {exc}") from None
    if isinstance(doc, dict) and "offline_gate" in doc:
        doc = doc["offline_gate"]
    try:
        return OfflineGate.model_validate(doc)
    except ValidationError as exc:
        raise _bad(f"{path}: invalid offline_gate: {exc}") from None


@app.command()
def gate(
    experiment: Annotated[str, typer.Argument(help="Experiment name or id.")],
    declare: Annotated[
        Path | None, typer.Option("--declare", help="YAML/JSON offline_gate to store (audited) first.")
    ] = None,
    actor: Annotated[str | None, typer.Option(help="Who decides (default: the local user).")] = None,
    as_json: JsonOpt = False,
    database_url: DbOpt = None,
) -> None:
    """Decide the offline gate for each candidate variant (exit 0 only when all pass)."""
    from evals import gatekeeper, store
    from liftgate import db

    who = f"cli:{actor or getpass.getuser()}"
    declaration = _load_declaration(declare) if declare else None
    engine = db.make_engine(_database_url(database_url))
    try:
        with engine.begin() as conn:
            exp = store.experiment(conn, experiment)
            if declaration is not None:
                store.set_declaration(conn, exp.id, declaration.model_dump(mode="json"), who)
        _, outcomes = gatekeeper.evaluate(engine, experiment, None, who)
    except store.StoreError as exc:
        raise _bad(str(exc)) from None
    finally:
        engine.dispose()
    for o in outcomes:
        if o.paused:  # control.gates paused the running test that showed it: say so, on stderr
            err.print(f"[red]experiment {exp.name!r} paused[/red]: {o.paused}. Its users get the control; "
                      "starting it again checks the gate.", soft_wrap=True)  # fmt: skip
        if as_json:
            _emit({"decision_id": o.decision_id, "variant": o.candidate.variant, "baseline": o.baseline.variant,
                   "passed": o.decision.passed, "verdict": o.decision.verdict, "reasons": list(o.decision.reasons),
                   "evidence": [c.to_json() for c in o.decision.categories], "suites": list(o.suites),
                   "paused": o.paused})  # fmt: skip
        else:
            _render_decision(o.candidate.variant, o.baseline.variant, o.decision)
    if not all(o.decision.passed for o in outcomes):
        raise typer.Exit(1)


def _ci(lo: float, hi: float) -> str:
    return "—" if math.isnan(lo) else f"[{lo * 100:+.1f}, {hi * 100:+.1f}]"


def _render_decision(variant: str | None, baseline: str | None, decision: Any) -> None:
    style = "bold green" if decision.passed else "bold red"
    console.print(
        f"offline gate for [bold]{variant}[/] vs {baseline}: [{style}]{decision.verdict.upper()}[/]"
    )
    table = Table(header_style="bold")
    for col in ("category", "items", baseline or "baseline", variant or "candidate", "Δ pts", "95% CI (pts)",
                "p (worse, Holm)", "margin", "verdict"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("category", "verdict") else "right")
    colours = {"pass": "green", "forgetting": "red", "insufficient": "yellow"}
    for v in decision.categories:
        c = v.comparison
        p = "—" if v.p_worse_holm is None else f"{v.p_worse_holm:.3g}"
        margin = "—" if v.margin is None else f"{v.margin * 100:.1f}"
        table.add_row(v.category, str(c.n), f"{c.baseline:.1%}", f"{c.candidate:.1%}", f"{c.difference * 100:+.1f}",
                      _ci(c.lower, c.upper), p, margin, f"[{colours.get(v.verdict, 'red')}]{v.verdict}[/]")  # fmt: skip
    console.print(table)
    for reason in decision.reasons:
        console.print(f"  [red]✗[/] {reason}")


@app.command()
def show(
    experiment: Annotated[str, typer.Argument(help="Experiment name or id.")],
    items: Annotated[int, typer.Option(min=0, max=1000, help="Failing items to show with both outputs.")] = 5,
    as_json: JsonOpt = False,
    database_url: DbOpt = None,
) -> None:
    """The latest runs (category × variant pass rates), gate decisions and items the candidate lost."""
    from evals import store
    from evals.stats import wilson
    from liftgate import db

    engine = db.make_engine(_database_url(database_url))
    try:
        with engine.connect() as conn:
            exp = store.experiment(conn, experiment)
            runs = store.runs_of(conn, exp.id)
            decisions = store.decisions(conn, exp.id, limit=len(exp.candidates) or 1)
            control = exp.control.variant
            lost = []
            for run in runs:
                if run.variant == control:
                    continue
                base = next((r for r in runs if r.variant == control and r.dataset == run.dataset), None)
                if base is not None and items:
                    lost += [{"dataset": run.dataset, "variant": run.variant, **row}
                             for row in store.failing_items(conn, base.id, run.id, items)]  # fmt: skip
    except store.StoreError as exc:
        raise _bad(str(exc)) from None
    finally:
        engine.dispose()
    if as_json:
        for r in runs:
            _emit({"run": r.id, "variant": r.variant, "dataset": r.dataset, "status": r.status,
                   "fingerprint": r.fingerprint, "summary": r.summary})  # fmt: skip
        for d in decisions:
            _emit({"decision": d})
        for row in lost:
            _emit({"lost_item": row})
        return
    variants = [t.variant for t in exp.targets]
    table = Table(title=f"{exp.name}: pass rate by category (95% Wilson CI)", header_style="bold")
    table.add_column("dataset · category")
    for v in variants:
        table.add_column(str(v), justify="right")
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in runs:
        for cat, c in r.summary.get("categories", {}).items():
            lo, hi = wilson(c["passed"], c["outputs"])
            mark = "" if r.status == "completed" else f" ({r.status})"
            cells.setdefault((r.dataset, cat), {})[str(r.variant)] = (
                f"{c['passed'] / c['outputs']:.1%} [{lo:.0%}–{hi:.0%}]{mark}")  # fmt: skip
    for (ds, cat), row in sorted(cells.items()):
        table.add_row(f"{ds} · {cat}", *(row.get(str(v), "—") for v in variants))
    console.print(table)
    for d in decisions:
        style = "green" if d["passed"] else "red"
        console.print(f"gate {d['variant']} ({d['created_at']:%Y-%m-%d %H:%M}, fingerprint {d['candidate_fingerprint'][:12]}): "
                      f"[{style}]{d['verdict']}[/] " + "; ".join(d["reasons"]))  # fmt: skip
    if lost:
        side = Table(
            title="items the candidate failed and the baseline passed", header_style="bold", show_lines=True
        )
        for col in ("item", control or "baseline", "candidate", "why it failed"):
            side.add_column(col, overflow="fold", max_width=60)
        for row in lost:
            side.add_row(f"{row['dataset']}/{row['item_id']}\n({row['category']}, {row['variant']})",
                         (row["baseline_output"] or "")[:600], (row["candidate_output"] or "")[:600], row["reason"])  # fmt: skip
        console.print(side)


@app.command()
def suites(
    export: Annotated[str | None, typer.Option(help="Write this built-in suite as JSONL to --out.")] = None,
    out: Annotated[Path | None, typer.Option(help="Output file for --export.")] = None,
) -> None:
    """List the built-in suites, or export one in the liftgate JSONL format."""
    from evals.datasets.builtin import SUITE_NAMES, builtin_suite
    from evals.datasets.loaders import dump_jsonl

    if export:
        if export not in SUITE_NAMES or out is None:
            raise _bad(f"--export needs one of {', '.join(SUITE_NAMES)} and --out FILE")
        dump_jsonl([b.item for b in builtin_suite(export)], out)
        console.print(f"wrote {len(builtin_suite(export))} items to {out}")
        return
    for suite_name in SUITE_NAMES:
        console.print(f"{suite_name:<24} {len(builtin_suite(suite_name)):>4} items")
