"""``liftgate datasets create|list|show|split|export|replays|delete|reference|retention``: production
calls become versioned evaluation and training datasets (see docs/datasets.md).

Uses the database directly (``--database-url`` / ``LIFTGATE_DATABASE_URL``, default: the one
``liftgate up`` starts): the database credential is what authorises these actions, and each
one that changes or exports data is written to ``audit_log`` with ``cli:<--actor or user>``.
Exit codes: 0 done, 2 bad input or refused (e.g. an export that would leak a holdout).
"""

from __future__ import annotations

import getpass
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from liftgate.cli_eval import DbOpt, JsonOpt, _database_url

app = typer.Typer(
    help="Curate production calls into versioned datasets; split, export, delete.", no_args_is_help=True
)
console = Console(soft_wrap=True)
err = Console(stderr=True)
ActorOpt = Annotated[
    str | None, typer.Option("--actor", help="Who acts (audit log); default: your user name.")
]


def _actor(actor: str | None) -> str:
    return f"cli:{actor or getpass.getuser()}"


def _engine(url: str | None) -> Any:
    from liftgate import db

    return db.make_engine(_database_url(url))


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}")
    return typer.Exit(2)


def _time(value: str | None, what: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _fail(ValueError(f"{what}: not an ISO 8601 time: {value!r}")) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Dataset name (a new version when it exists).")],
    from_experiment: Annotated[str, typer.Option("--from-experiment", help="Experiment name or id.")],
    variant: Annotated[str | None, typer.Option(help="Only this variant's calls.")] = None,
    category: Annotated[str | None, typer.Option(help="Only this task category.")] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            "--where", help="feedback=thumbs_down|regenerated|edited|judge_disagrees|error (any of them)."
        ),
    ] = None,
    sample: Annotated[int | None, typer.Option(min=1, help="Keep at most N items (seeded).")] = None,
    stratify: Annotated[str, typer.Option(help="category (proportional quotas) or none.")] = "category",
    seed: Annotated[int, typer.Option(min=0)] = 0,
    since: Annotated[str | None, typer.Option(help="ISO time (UTC if no zone): calls at or after.")] = None,
    until: Annotated[str | None, typer.Option(help="ISO time: calls before.")] = None,
    description: Annotated[str | None, typer.Option()] = None,
    ttl_days: Annotated[
        int | None, typer.Option("--ttl-days", min=1, help="Delete the dataset after N days.")
    ] = None,
    as_json: JsonOpt = False,
    actor: ActorOpt = None,
    database_url: DbOpt = None,
) -> None:
    """Build a new immutable version from stored calls (content logging must be 'full')."""
    from pydantic import ValidationError

    from curation import store
    from curation.builder import create_version
    from curation.spec import CurationError, CurationSpec, parse_where

    try:
        spec = CurationSpec(experiment=from_experiment, variant=variant, category=category,
                            feedback=parse_where(where or []), sample=sample, stratify=stratify, seed=seed,
                            since=_time(since, "--since"), until=_time(until, "--until"))  # fmt: skip
    except (ValidationError, CurationError) as exc:
        raise _fail(exc) from None
    engine = _engine(database_url)
    try:
        info = create_version(engine, name, spec, _actor(actor), description)
        if ttl_days:
            with engine.begin() as conn:
                store.set_expiry(conn, name, datetime.now(UTC) + timedelta(days=ttl_days), _actor(actor))
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    out = {"dataset": info.dataset, "version": info.version, "items": info.item_count,
           "content_hash": info.content_hash, "stats": info.stats}  # fmt: skip
    if as_json:
        sys.stdout.write(json.dumps(out) + "\n")
        return
    st = info.stats
    console.print(
        f"{info.dataset}@{info.version}: {info.item_count} items (content hash {info.content_hash[:16]}…)"
    )
    console.print(f"  {st['matched']} calls matched; dropped {st['without_text']} without text, "
                  f"{st['exact_duplicates']} exact and {st['near_duplicates']} near duplicates; "
                  f"{st['references']} with a user reference, {st['pairs']} preference pairs")  # fmt: skip
    console.print("  categories: " + ", ".join(f"{k} {v}" for k, v in st["categories"].items()))


@app.command("list")
def list_(as_json: JsonOpt = False, database_url: DbOpt = None) -> None:
    """Every dataset with its newest version."""
    from curation import store

    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            rows = store.datasets(conn)
    finally:
        engine.dispose()
    if as_json:
        for r in rows:
            sys.stdout.write(json.dumps(r) + "\n")
        return
    table = Table(header_style="bold")
    for col in ("name", "version", "items", "content hash", "created by", "expires"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], str(r["latest_version"]), str(r["items"]), (r["content_hash"] or "")[:16],
                      r["created_by"], r["expires_at"] or "—")  # fmt: skip
    console.print(table)


@app.command()
def show(name: str, as_json: JsonOpt = False, database_url: DbOpt = None) -> None:
    """Versions (filters, counts, splits) and the export record of one dataset."""
    from curation import store
    from curation.spec import CurationError

    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            data = store.show(conn, name)
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    console.print(
        f"[bold]{data['name']}[/bold] by {data['created_by']}"
        + (f" — {data['description']}" if data["description"] else "")
    )
    for v in data["versions"]:
        splits = "; ".join(f"{s}: {sum(c.values())}" for s, c in v["splits"].items())
        console.print(
            f"  v{v['version']}: {v['items']} items, {splits}, hash {v['content_hash'][:16]}…, spec {json.dumps(v['spec'])}"
        )
    for e in data["exports"]:
        console.print(
            f"  export v{e['version']} {e['format']} ({e['split']}): {e['status']}, {e['items']} items by {e['actor']}"
        )


@app.command()
def replays(name: str, as_json: JsonOpt = False, database_url: DbOpt = None) -> None:
    """Stored offline replays of a dataset (`liftgate eval run production:NAME`), newest first."""
    from curation import store
    from curation.spec import CurationError

    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            data = store.replays(conn, name)
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    if as_json:
        for r in data:
            sys.stdout.write(json.dumps(r) + "\n")
        return
    if not data:
        console.print(
            f"no replay of {name} yet (liftgate eval run production:{name} --experiment EXP --judge-url URL)"
        )
        return

    def pct(x: float | None) -> str:
        return "—" if x is None else f"{x:.1%}"

    def rates(o: dict[str, Any]) -> str:
        p = "—" if o["p_value"] is None else f"{o['p_value']:.3g}"
        lc = (f"LC {pct(o['lc_rate'])} [{pct(o['lc_low'])}, {pct(o['lc_high'])}] p {o['lc_p_value']:.3g}"
              if o["lc_rate"] is not None else f"LC — ({o['error'] or 'no fit'})")  # fmt: skip
        return f"win rate {pct(o['rate'])} [{pct(o['ci_low'])}, {pct(o['ci_high'])}] p {p}; {lc}"

    for r in data:
        console.print(
            f"[bold]#{r['id']}[/bold] v{r['version']} on {r['experiment']}: {r['candidate']} vs {r['baseline']}, "
            f"{r['items']} items ({r['failed']} failed), judge {r['judge']}, {r['created_at'][:19]} by {r['actor']}"
        )
        console.print(f"  all: {rates(r['overall'])}")
        for c in r["categories"]:
            holm = "—" if c["p_holm"] is None else f"{c['p_holm']:.3g}"
            lc_holm = "—" if c["lc_p_holm"] is None else f"{c['lc_p_holm']:.3g}"
            console.print(f"  {c['category']}: {rates(c)} (Holm: p {holm}, LC p {lc_holm})")


@app.command()
def split(
    ref: Annotated[str, typer.Argument(help="NAME[@VERSION] (default: newest).")],
    holdout: Annotated[float, typer.Option(help="Share of each category sealed as holdout.")] = 0.2,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    as_json: JsonOpt = False,
    actor: ActorOpt = None,
    database_url: DbOpt = None,
) -> None:
    """A new version split into eval and a sealed holdout (seeded, stratified by category)."""
    from curation.spec import CurationError
    from curation.split import split as do_split

    engine = _engine(database_url)
    try:
        info = do_split(engine, ref, holdout, seed, _actor(actor))
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    out = {"dataset": info.dataset, "version": info.version, "content_hash": info.content_hash, **info.stats}
    if as_json:
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        console.print(
            f"{info.dataset}@{info.version}: {info.stats['eval']} eval, {info.stats['holdout']} holdout (sealed)"
        )


@app.command("export")
def export_(
    ref: Annotated[str, typer.Argument(help="NAME[@VERSION] (default: newest).")],
    fmt: Annotated[str, typer.Option("--format", help="chat (fine-tuning), preference, or eval.")],
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write ('-' = stdout).")],
    split: Annotated[str | None, typer.Option(help="eval format only: eval (default) or holdout.")] = None,
    actor: ActorOpt = None,
    database_url: DbOpt = None,
) -> None:
    """Stream a version as JSONL; training formats never include, or near-duplicate, a holdout item."""
    from curation.export import HoldoutLeak, export
    from curation.spec import CurationError

    engine = _engine(database_url)
    tmp = out.with_name(out.name + ".partial") if str(out) != "-" else None
    try:
        if tmp is None:
            result = export(engine, ref, fmt, sys.stdout.buffer, _actor(actor), split)
        else:
            # Written aside and renamed at the end: a refused or failed export leaves no file.
            with tmp.open("wb") as fh:
                result = export(engine, ref, fmt, fh, _actor(actor), split)
            tmp.replace(out)
    except HoldoutLeak as exc:
        raise _fail(exc) from None
    except (CurationError, OSError) as exc:
        raise _fail(exc) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        engine.dispose()
    err.print(f"{result.dataset}@{result.version} {result.format} ({result.split}): {result.items} lines"
              + (f", {result.skipped} items skipped (no usable answer or pair for this format)" if result.skipped else "")
              + f"; sha256 {result.content_hash}")  # fmt: skip


@app.command()
def delete(
    name: str,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    actor: ActorOpt = None,
    database_url: DbOpt = None,
) -> None:
    """Delete a dataset: every version, item and export record (audited)."""
    from curation import store
    from curation.spec import CurationError

    if not yes and not typer.confirm(f"delete dataset {name!r} with all its versions?"):
        raise typer.Exit(1)
    engine = _engine(database_url)
    try:
        with engine.begin() as conn:
            removed = store.delete(conn, name, _actor(actor))
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    console.print(
        f"deleted {name}: {removed['versions']} versions, {removed['items']} items, {removed['exports']} export records, {removed['replays']} replays"
    )


@app.command()
def reference(
    request_id: str,
    kind: Annotated[str, typer.Option(help="edit, task_success or rating.")],
    text_: Annotated[str | None, typer.Option("--text", help="edit: the corrected answer.")] = None,
    check: Annotated[
        str | None,
        typer.Option(help='task_success: a scorer spec as JSON, e.g. {"type": "answer", "answer": "42"}.'),
    ] = None,
    value: Annotated[float | None, typer.Option(help="rating: 0-10.")] = None,
    actor: ActorOpt = None,
    database_url: DbOpt = None,
) -> None:
    """Store a user's reference for one response (it becomes the item's reference and scorer)."""
    from curation import store
    from curation.spec import CurationError

    try:
        spec = json.loads(check) if check else None
    except ValueError:
        raise _fail(ValueError("--check is not JSON")) from None
    engine = _engine(database_url)
    try:
        with engine.begin() as conn:
            ref_id = store.add_reference(
                conn, request_id, kind, _actor(actor), text_=text_, check=spec, value=value
            )
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    console.print(f"reference {ref_id} stored for {request_id}")


@app.command()
def retention(
    ttl_days: Annotated[
        int | None, typer.Option("--ttl-days", min=1, help="Keep stored text this many days.")
    ] = None,
    experiment: Annotated[
        str | None, typer.Option(help="Experiment name or id (default: every experiment).")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the policy (text kept).")] = False,
    enforce: Annotated[bool, typer.Option("--enforce", help="Run the retention job now.")] = False,
    actor: ActorOpt = None,
    database_url: DbOpt = None,
) -> None:
    """Set content retention, show it, or run the job (clear text past its TTL, delete expired datasets)."""
    from curation import retention as ret
    from curation import source
    from curation.spec import CurationError

    engine = _engine(database_url)
    try:
        with engine.begin() as conn:
            scope = source.experiment(conn, experiment).id if experiment else ret.DEFAULT_SCOPE
            if ttl_days is not None or clear:
                ret.set_policy(conn, scope, None if clear else ttl_days, _actor(actor))
            rules = ret.policies(conn)
        if enforce:
            run = ret.enforce(engine, datetime.now(UTC))
            console.print(
                f"cleared the text of {run.cleared} calls; deleted {len(run.datasets_deleted)} expired datasets"
            )
    except CurationError as exc:
        raise _fail(exc) from None
    finally:
        engine.dispose()
    for scope_id, days in sorted(rules.items()):
        console.print(f"{'default' if scope_id == 0 else f'experiment {scope_id}'}: {days} days")
    if not rules:
        console.print("no retention policy: stored text is kept")
