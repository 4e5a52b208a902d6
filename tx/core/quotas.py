"""Quotas per API key: how much of the server one key may hold, and the error past it.

Each quota is checked where its use is decided, before anything is held:

| quota | checked by | frees when |
|---|---|---|
| sessions | `SessionService.create` | the key finishes sessions (or they time out) |
| runs, lora_rank | `RunService.create*` | the key's sessions end (their runs unload) |
| queued_training_bytes | `Sequencer.submit` | the key's queued training calls run (transient) |
| samples_in_flight | `SamplingService` | the key's samples finish (transient) |
| checkpoint_bytes | `CheckpointWriter`, `WeightCopies` | the key deletes checkpoints, or they expire |
| custom_losses | `CustomLosses.create` | the key's sessions end |
| images_per_request | at submission | (a shape rule: send fewer images) |
| audio_frames_per_request | at submission | (a shape rule: send shorter clips) |

Past a quota the call fails with `QuotaExceededError`: HTTP 429 with Retry-After for a transient one, 403
otherwise, with a message that names the quota, the use, the limit and the setting that raises it. Operators see
every key's use of every quota at `GET /api/v1/tx/usage` and in /metrics (`tx_tenant_usage`).
"""

from __future__ import annotations

from tx.config.sections import QuotaSection
from tx.types import QuotaExceededError

__all__ = ["QuotaExceededError", "QuotaLimits", "check", "setting_of"]


QuotaLimits = QuotaSection  # every key's limits: the settings' quota section (tx/config/sections.py)


UNITS = {
    "sessions": "open sessions", "runs": "loaded training runs", "lora_rank": "LoRA rank over loaded runs",
    "queued_training_bytes": "bytes of queued training requests", "samples_in_flight": "sequences being sampled",
    "checkpoint_bytes": "bytes of checkpoints on disk", "custom_losses": "custom losses",
    "images_per_request": "images in one prompt or datum",
    "audio_frames_per_request": "audio frames in one prompt or datum",
}
TRANSIENT = frozenset({"queued_training_bytes", "samples_in_flight"})
_FREE = {
    "sessions": "finish sessions you no longer use",
    "runs": "finish sessions whose runs you no longer train",
    "lora_rank": "finish sessions whose runs you no longer train, or use a smaller rank",
    "queued_training_bytes": "wait for queued calls to run (retry after Retry-After)",
    "samples_in_flight": "wait for samples in flight to finish (retry after Retry-After)",
    "checkpoint_bytes": "delete checkpoints you no longer need",
    "custom_losses": "finish sessions whose losses you no longer use",
    "images_per_request": "send fewer images per request",
    "audio_frames_per_request": "send shorter or fewer audio clips per request",
}


def setting_of(quota: str) -> str:
    """How an operator raises `quota`: its flag and environment variable."""
    return f"--quota-{quota.replace('_', '-')} / TX_QUOTA_{quota.upper()}"


def check(quota: str, used: int, adding: int, limit: int, asked: str | None = None) -> None:
    """Raise QuotaExceededError when `used + adding` is over `limit` (a request alone over it counts too).
    `asked`: how the message names what was asked, when not "`adding` more"."""
    if used + adding <= limit:
        return
    unit = UNITS[quota]
    if adding > limit:  # alone over it: no retry can succeed
        raise QuotaExceededError(
            f"quota {quota!r} of this API key: {adding} {unit} in one request is over its limit of {limit}; ask "
            f"for fewer, or ask the operator to raise {setting_of(quota)}", quota=quota, transient=False)
    raise QuotaExceededError(
        f"quota {quota!r} of this API key is full: {used} {unit} held, {asked or f'{adding} more'} asked, "
        f"limit {limit}; "
        f"{_FREE[quota]}, or ask the operator to raise {setting_of(quota)}",
        quota=quota, transient=quota in TRANSIENT,
    )
