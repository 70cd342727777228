"""Where the config snapshot comes from: PostgreSQL (refreshed in the background) or a fixed one.

The refresh loop first asks the database for a cheap *version* — an md5 over the rows of the
config tables (metric definitions included: they declare the custom feedback kinds) — and
rebuilds the snapshot only when it changed. The fingerprint covers every column, so a writer
that forgets ``updated_at`` (e.g. a controller changing weights) is still picked up. Both
queries run in a worker thread; the event loop never blocks on I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import Engine, create_engine, text

from contracts import redaction
from gateway.feedback import declared_kinds
from gateway.snapshot import (
    EMPTY,
    SERVING_STATUSES,
    ExperimentConfig,
    Snapshot,
    UpstreamConfig,
    VariantConfig,
)
from gateway.snapshot import build_snapshot as _build

log = logging.getLogger(__name__)

_VERSION_SQL = text(
    """
    SELECT
      (SELECT md5(coalesce(string_agg(e::text, ',' ORDER BY e.id), '')) FROM experiments e)
      || (SELECT md5(coalesce(string_agg(v::text, ',' ORDER BY v.id), '')) FROM variants v)
      || (SELECT md5(coalesce(string_agg(u::text, ',' ORDER BY u.id), '')) FROM upstreams u)
      || (SELECT md5(coalesce(string_agg(k.key_hash || k.revoked::text, ',' ORDER BY k.id), ''))
          FROM api_keys k)
      || (SELECT md5(coalesce(string_agg(m.definition::text, ',' ORDER BY m.id), ''))
          FROM metric_definitions m)
    """
)
_UPSTREAMS_SQL = text(
    "SELECT name, base_url, api_key, timeout_s, connect_timeout_s, max_connections FROM upstreams"
)
_EXPERIMENTS_SQL = text(
    """
    SELECT id, name, route, mode, status, salt, unit_key, coverage, targeting, forced,
           shadow_sample_rate, fallback_to_control, content_logging, rollout_stage, blinding,
           extract(epoch FROM updated_at) AS updated
    FROM experiments WHERE status = ANY(:statuses)
    """
)
_VARIANTS_SQL = text(
    """
    SELECT v.experiment_id, v.name, u.name AS upstream, v.model, v.weight, v.is_control
    FROM variants v JOIN upstreams u ON u.id = v.upstream_id
    WHERE v.experiment_id = ANY(:ids) ORDER BY v.id
    """
)
_KEYS_SQL = text("SELECT key_hash FROM api_keys WHERE NOT revoked")
_METRICS_SQL = text("SELECT definition FROM metric_definitions")


class ConfigSource(Protocol):
    def version(self) -> str: ...

    def load(self) -> Snapshot: ...


class StaticConfigSource:
    """A fixed snapshot (benchmarks, unit tests); ``set`` swaps it."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def set(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def version(self) -> str:
        return self._snapshot.version or str(id(self._snapshot))

    def load(self) -> Snapshot:
        return self._snapshot


class DatabaseConfigSource:
    """Reads ``contracts.tables`` with a small dedicated engine."""

    def __init__(self, url: str) -> None:
        # hide_parameters: a database error never carries the statement's values (logs).
        self.engine: Engine = create_engine(
            url, pool_size=1, max_overflow=1, pool_pre_ping=True, hide_parameters=True
        )

    def version(self) -> str:
        with self.engine.connect() as conn:
            return str(conn.execute(_VERSION_SQL).scalar_one())

    def load(self) -> Snapshot:
        with self.engine.connect() as conn:
            version = str(conn.execute(_VERSION_SQL).scalar_one())
            upstreams = [UpstreamConfig(**dict(r._mapping)) for r in conn.execute(_UPSTREAMS_SQL)]
            redaction.remember(*(u.api_key for u in upstreams))  # masked in every log from now on
            rows = [
                dict(r._mapping) for r in conn.execute(_EXPERIMENTS_SQL, {"statuses": list(SERVING_STATUSES)})
            ]
            variants: dict[int, list[VariantConfig]] = {}
            for r in conn.execute(_VARIANTS_SQL, {"ids": [row["id"] for row in rows]}):
                m = dict(r._mapping)
                variants.setdefault(m.pop("experiment_id"), []).append(VariantConfig(**m))
            keys = frozenset(str(r[0]) for r in conn.execute(_KEYS_SQL))
            kinds = declared_kinds(r[0] for r in conn.execute(_METRICS_SQL))
        experiments: list[ExperimentConfig] = []
        order: dict[int, float] = {}
        for row in rows:
            order[row["id"]] = float(row.pop("updated") or 0.0)
            experiments.append(_experiment(row, tuple(variants.get(row["id"], ()))))
        return _build(experiments, upstreams, keys, version, order, kinds)

    def dispose(self) -> None:
        self.engine.dispose()


def _experiment(row: dict[str, Any], variants: tuple[VariantConfig, ...]) -> ExperimentConfig:
    forced = row.pop("forced") or {}
    targeting = row.pop("targeting") or []
    blinding = row.pop("blinding", None) or {}
    return ExperimentConfig(
        **row,
        echo_model=blinding.get("echo_model", True) is not False,
        variant_header=str(blinding.get("variant_header") or "on_request"),
        variants=variants,
        forced={str(k): str(v) for k, v in forced.items()},
        targeting=tuple(targeting),
    )


class SnapshotHolder:
    """Holds the current snapshot; ``run`` refreshes it every ``interval`` seconds.

    ``apply`` prepares the process for a new snapshot (upstream clients) *before* it is
    installed, so a request never sees routes whose clients are missing; it returns the parts
    it could not apply (upstream -> reason). The snapshot is installed anyway — the other
    upstreams and every route take effect — and the failed parts are retried every tick,
    also when the database's version has not changed, until they apply (``problems``).
    """

    def __init__(
        self,
        source: ConfigSource,
        interval: float = 0.5,
        apply: Callable[[Snapshot], dict[str, str]] | None = None,
        on_tick: Callable[[bool], None] | None = None,
    ) -> None:
        self.source = source
        self.interval = interval
        self.current: Snapshot = EMPTY
        self.loaded_at = 0.0
        self.problems: dict[str, str] = {}
        self._apply = apply
        self._on_tick = on_tick
        self._last_error = ""
        self._last_logged = 0.0

    async def refresh(self) -> bool:
        """One refresh; True when a new snapshot was installed (or failed parts retried)."""
        version = await asyncio.to_thread(self.source.version)
        unchanged = version == self.current.version and bool(self.loaded_at)
        if unchanged and not self.problems:
            self.loaded_at = time.monotonic()
            return False
        snap = self.current if unchanged else await asyncio.to_thread(self.source.load)
        problems = self._apply(snap) if self._apply is not None else {}
        self.current = snap
        self.loaded_at = time.monotonic()
        if problems != self.problems:
            if problems:
                log.warning(
                    "config snapshot installed (%s routes, %s upstreams), but %s kept the previous "
                    "client or none (retrying every %.1f s): %s",
                    len(snap.routes),
                    len(snap.upstreams),
                    ", ".join(sorted(problems)),
                    self.interval,
                    "; ".join(f"{name}: {reason}" for name, reason in sorted(problems.items())),
                )
            elif self.problems:
                log.info("every upstream's config is applied now")
        elif not unchanged:
            log.info("config snapshot loaded: %s routes, %s upstreams", len(snap.routes), len(snap.upstreams))
        self.problems = problems
        return True

    async def run(self) -> None:
        while True:
            ok = True
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # nothing was installed: keep serving the last good snapshot
                ok = False
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                now = time.monotonic()
                # Every 0.5 s would flood the log during an outage: log changes, else every 30 s.
                if reason != self._last_error or now - self._last_logged > 30:
                    log.warning("config refresh failed, keeping the last snapshot: %s", reason)
                    self._last_error, self._last_logged = reason, now
            else:
                if self._last_error:
                    log.info("config refresh recovered")
                self._last_error = ""
            if self._on_tick is not None:
                self._on_tick(ok and not self.problems)
            await asyncio.sleep(self.interval)
