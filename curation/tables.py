"""The curation tables: datasets, their immutable versions and items, exports, user
references and content retention policies.

They share ``contracts.tables.Base`` (one metadata, one Alembic history); importing this
module registers them (``migrations/env.py`` does). ``curation.store`` is the one writer of
every table here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from contracts.tables import Base


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Dataset(Base):
    """A named, versioned dataset curated from production interactions."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))
    #: The retention job deletes the dataset (items, versions, export records) after this.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()


class DatasetVersion(Base):
    """One immutable version: its items never change; ``content_hash`` is SHA-256 over them.

    ``spec`` holds how it was made (the curation filters, or the split of its parent)."""

    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    parent_version: Mapped[int | None] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))
    item_count: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    stats: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = _created()


class DatasetItem(Base):
    """One curated item of a version: redacted text, provenance, optional reference and pair.

    ``text_hash`` = SHA-256 of the normalised prompt; ``minhash`` = its MinHash signature
    (``curation.minhash``), kept so holdout leaks are found by near-duplicate too."""

    __tablename__ = "dataset_items"
    __table_args__ = (
        CheckConstraint("split IN ('none', 'eval', 'holdout')", name="split"),
        Index("ix_dataset_items_holdout_hash", "text_hash", postgresql_where="split = 'holdout'"),
    )

    version_id: Mapped[int] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="CASCADE"), primary_key=True
    )
    item_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    category: Mapped[str] = mapped_column(String(64))
    split: Mapped[str] = mapped_column(String(8), server_default="none")
    text_hash: Mapped[str] = mapped_column(String(64))
    minhash: Mapped[bytes] = mapped_column(LargeBinary)
    prompt: Mapped[str] = mapped_column(Text)
    response: Mapped[str | None] = mapped_column(Text)
    reference: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    pair: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSONB)


class DatasetExport(Base):
    """The record of one export (or refused export) of a version."""

    __tablename__ = "dataset_exports"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("dataset_versions.id", ondelete="CASCADE"), index=True)
    format: Mapped[str] = mapped_column(String(16))
    split: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16))
    item_count: Mapped[int] = mapped_column(Integer, server_default="0")
    skipped: Mapped[int] = mapped_column(Integer, server_default="0")
    content_hash: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = _created()


class FeedbackReference(Base):
    """What a user supplied as the right answer to one response (by request id).

    ``kind``: ``edit`` (``text`` = the corrected answer), ``task_success`` (``check`` = a
    verifiable scorer spec in the eval item format) or ``rating`` (``value``)."""

    __tablename__ = "feedback_references"
    __table_args__ = (CheckConstraint("kind IN ('edit', 'task_success', 'rating')", name="kind"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    text: Mapped[str | None] = mapped_column(Text)
    check: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    value: Mapped[float | None] = mapped_column(Double)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = _created()


class ContentRetention(Base):
    """How long stored prompt and response text is kept: ``experiment_id`` 0 is the default
    for every experiment without its own row. The retention job clears older text."""

    __tablename__ = "content_retention"
    __table_args__ = (CheckConstraint("ttl_days > 0", name="ttl_days"),)

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ttl_days: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime] = _created()


class DatasetReplay(Base):
    """One stored offline replay of a version: a candidate against the baseline of an
    experiment, judged pairwise (``curation.replay``). ``overall`` and ``categories`` hold
    the win rates as reported (raw and length-controlled, CIs, p-values, Holm per category);
    ``baseline_run_id``/``candidate_run_id`` are the offline gate's runs whose outputs were
    judged. Deleted with its version."""

    __tablename__ = "dataset_replays"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("dataset_versions.id", ondelete="CASCADE"), index=True)
    experiment_id: Mapped[int] = mapped_column(Integer)
    baseline: Mapped[str] = mapped_column(String(64))
    candidate: Mapped[str] = mapped_column(String(64))
    baseline_run_id: Mapped[int] = mapped_column(Integer)
    candidate_run_id: Mapped[int] = mapped_column(Integer)
    judge: Mapped[str] = mapped_column(String(256))
    items: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    overall: Mapped[dict[str, Any]] = mapped_column(JSONB)
    categories: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = _created()
