"""Database rows (SQLAlchemy 2). Separate from wire schemas and domain types on purpose."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class SessionRow(Base):
    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    sdk_version: Mapped[str | None] = mapped_column(String(32))
    tags: Mapped[list] = mapped_column(JSON, default=list)
    user_metadata: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    project_id: Mapped[str | None] = mapped_column(String(128))
    display_name: Mapped[str | None] = mapped_column(String(256))


class TrainingRunRow(Base):
    __tablename__ = "training_runs"

    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id"), index=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    base_model: Mapped[str] = mapped_column(String(256))
    lora_rank: Mapped[int] = mapped_column(Integer)
    lora_config: Mapped[dict] = mapped_column(JSON)
    user_metadata: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_request_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    corrupted: Mapped[bool] = mapped_column(Boolean, default=False)
    # A run made by copy_weights holds the copy (`copied_from`: the source's tinker path) and is never trained;
    # `copy_request` is the copy's idempotency key, one copy per (owner, key).
    copied_from: Mapped[str | None] = mapped_column(String(512))
    copy_request: Mapped[str | None] = mapped_column(String(160))
    # {"type": "adamw"|"dimuon", "version": 1}, fixed for the run's life; None (rows before it): adamw
    optimizer_config: Mapped[dict | None] = mapped_column(JSON)
    # the base model's weights at create (migration 0009): its hub commit (None: a local directory) and
    # tx.models.fingerprint; both None for runs recorded before, which load onto any base of their name
    base_revision: Mapped[str | None] = mapped_column(String(64))
    base_fingerprint: Mapped[str | None] = mapped_column(String(80))
    # what its owner calls it (<= 120 chars) and its tags (<= 16 of <= 40 chars; None: none), migration 0009
    name: Mapped[str | None] = mapped_column(String(120))
    tags: Mapped[list | None] = mapped_column(JSON)

    __table_args__ = (Index("ix_training_runs_copy_request", "owner", "copy_request", unique=True),)


class CheckpointRow(Base):
    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(ForeignKey("training_runs.run_id"), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(300), primary_key=True)  # "<kind>/<name>"
    kind: Mapped[str] = mapped_column(String(32))  # weights | sampler_weights | external_weights
    owner: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    user_metadata: Mapped[dict | None] = mapped_column(JSON)
    public: Mapped[bool] = mapped_column(Boolean, default=False)
    # new at every save, also of a name saved before: what signed download links bind to (migration 0004)
    creation_id: Mapped[str] = mapped_column(String(32), default=lambda: uuid.uuid4().hex)


class SamplingSessionRow(Base):
    __tablename__ = "sampling_sessions"

    sampling_session_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id"), index=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    base_model: Mapped[str] = mapped_column(String(256))
    model_path: Mapped[str | None] = mapped_column(String(512))
    run_id: Mapped[str | None] = mapped_column(String(128))
    weights_dir: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # clients that joined it (join_sampling_session: an unpickled SamplingClient); the original one is 0
    clients_joined: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class RunMetricRow(Base):
    """What one training call of a run measured (forward_backward, forward, optim_step): the console's curves.
    Bounded per run: `tx/core/run_metrics.py` thins a run's oldest rows past its bound."""

    __tablename__ = "run_metrics"

    run_id: Mapped[str] = mapped_column(ForeignKey("training_runs.run_id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)  # the run's recorded calls, numbered from 1
    step: Mapped[int] = mapped_column(Integer)  # the optimizer step the call belongs to, from 1
    kind: Mapped[str] = mapped_column(String(32))  # forward_backward | forward | optim_step
    finished: Mapped[float] = mapped_column(Float)  # unix seconds
    seconds: Mapped[float] = mapped_column(Float)  # time on the trainer
    tokens: Mapped[int] = mapped_column(Integer)  # target tokens of this call (0 for optim_step)
    total_tokens: Mapped[int] = mapped_column(BigInteger)  # target tokens the run trained on so far
    metrics: Mapped[dict] = mapped_column(JSON)  # name -> number (loss_per_token, grad_norm, ...)


class StabilityRecordRow(Base):
    """One sequence sampled with `record_stability_info` (tx/core/sampling/records.py): what StableReinforce
    training reads back by its `sequence_id`."""

    __tablename__ = "stability_records"
    __table_args__ = (Index("ix_stability_records_session_used", "session_id", "last_used_at"),)

    sequence_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id"))
    owner: Mapped[str] = mapped_column(String(64))
    sampler_id: Mapped[str] = mapped_column(String(160))
    base_model: Mapped[str] = mapped_column(String(256))
    weights_version: Mapped[int | None] = mapped_column(Integer)  # None: the base model's own weights
    prompt_length: Mapped[int] = mapped_column(Integer)
    num_tokens: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[bytes] = mapped_column(LargeBinary)  # int32, little-endian
    logprobs: Mapped[bytes] = mapped_column(LargeBinary)  # float32, little-endian
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class AuditRow(Base):
    """One audit entry: `actor` (a key's owner, or "tx" for the server itself) did `event` to a run, a checkpoint
    or a key; `subject_owner` is the owner of what it was done to, who may read the entry too."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    event: Mapped[str] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(64), index=True)
    subject_owner: Mapped[str | None] = mapped_column(String(64), index=True)
    run_id: Mapped[str | None] = mapped_column(String(128))
    tinker_path: Mapped[str | None] = mapped_column(String(512))
    details: Mapped[dict] = mapped_column(JSON, default=dict)
