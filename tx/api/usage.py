"""Every key's use of its quotas and its share of the accelerator, for operators: `GET /api/v1/tx/usage` (JSON)
and /metrics (`tx_tenant_usage`, `tx_tenant_tokens_total`). A key is named by its owner id (a hash of the key;
raw keys are never kept). Only keys holding something are listed, the busiest `MAX_KEYS` of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from tx.core.quotas import QuotaLimits, setting_of

if TYPE_CHECKING:
    from tx.api.context import Context

MAX_KEYS = 100


class KeyUsage(BaseModel):
    owner: str = Field(description="the key's owner id (sha256 of the key, shortened), as runs and checkpoints record it")
    sessions: int = Field(default=0, description="open sessions")
    runs: int = Field(default=0, description="training runs loaded (or being loaded)")
    lora_rank: int = Field(default=0, description="LoRA ranks of those runs, summed")
    queued_training_calls: int = Field(default=0, description="training calls queued, not yet run")
    queued_training_bytes: int = Field(default=0, description="their bytes")
    samples_in_flight: int = Field(default=0, description="sequences submitted and not yet done")
    samples_waiting: int = Field(default=0, description="of which waiting for engine capacity (fair share)")
    checkpoint_bytes: int = Field(default=0, description="bytes of unexpired checkpoints")
    custom_losses: int = Field(default=0, description="custom losses held")
    trained_tokens: int = Field(default=0, description="target tokens of its forward_backward passes since start")
    sampled_tokens: int = Field(default=0, description="tokens sampled for it since start")


class UsageReport(BaseModel):
    limits: dict[str, int] = Field(description="each quota's limit, the same for every key")
    settings: dict[str, str] = Field(description="the flag and environment variable that raise each quota")
    keys: list[KeyUsage] = Field(description="keys holding something, busiest first")


def usage_report(ctx: Context, limits: QuotaLimits) -> UsageReport:
    """Read every service's per-key counts (call it off the event loop: it reads the store)."""
    keys: dict[str, KeyUsage] = {}

    def of(owner: str) -> KeyUsage:
        return keys.setdefault(owner, KeyUsage(owner=owner))

    for owner, (sessions, checkpoint_bytes) in ctx.sessions.store.usage_by_owner().items():
        of(owner).sessions, of(owner).checkpoint_bytes = sessions, checkpoint_bytes
    for owner, (runs, rank) in ctx.runs.usage().items():
        of(owner).runs, of(owner).lora_rank = runs, rank
    for owner, (calls, size) in ctx.sequencer.scheduler.usage().items():
        of(owner).queued_training_calls, of(owner).queued_training_bytes = calls, size
    for owner, (in_flight, waiting) in ctx.sampling.admission.usage().items():
        of(owner).samples_in_flight, of(owner).samples_waiting = in_flight, waiting
    for owner, count in ctx.custom_losses.usage().items():
        of(owner).custom_losses = count
    for owner, tokens in dict(ctx.training.trained_by_owner).items():
        of(owner).trained_tokens = tokens
    for owner, tokens in dict(ctx.sampling.sampled_by_owner).items():
        of(owner).sampled_tokens = tokens
    ranked = sorted(keys.values(), key=lambda k: (-(k.runs + k.samples_in_flight + k.queued_training_calls),
                                                  -(k.trained_tokens + k.sampled_tokens), k.owner))
    return UsageReport(limits=limits.as_dict(), settings={q: setting_of(q) for q in limits.as_dict()},
                       keys=ranked[:MAX_KEYS])
