"""JSON bodies of the web console's routes (/api/v1/console/...): tx's own, not the SDK's."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tx.api.wire.schemas.base import WireRequest, WireResponse, counted_first


class ConsoleMe(WireResponse):
    owner: str = Field(description="the key's owner id (a hash of the key): what runs and checkpoints list as owner")
    operator: bool = Field(description="an operator key: the console lists every tenant's runs, sessions, checkpoints")
    engines: bool = Field(description="whether this key may read the engines page (operator routes)")
    base_models: list[str]
    labels: dict[str, str] = Field(
        default_factory=dict, description="{owner id: the operator's label for that key (--key-label)}: every label "
        "for an operator key, the key's own label (if any) for any other")


class ConsoleRun(WireResponse):
    run_id: str
    session_id: str
    owner: str
    base_model: str
    lora_rank: int
    created_at: datetime
    last_activity: datetime
    state: str = Field(description="training (calls queued, or one finished in the last minute) | idle (loaded, "
                                   "no call yet or none lately) | unloaded | corrupted")
    queued: int = Field(description="calls waiting on the training thread")
    steps: int = Field(description="optimizer steps recorded (forward calls after the last one are not a step)")
    tokens: int = Field(description="target tokens trained on (forward_backward)")
    last_loss: float | None = Field(description="loss per token of the newest forward_backward")
    name: str | None = Field(default=None, description="the run's name, set by its owner")
    tags: list[str] = Field(default_factory=list, description="the run's tags, set by its owner")
    base_revision: str | None = Field(default=None, description="the base model's hub commit at create (null: a "
                                      "local directory, or a run recorded before tx kept it)")
    base_fingerprint: str | None = Field(default=None, description="the base weights' fingerprint at create")


class RunLabelsRequest(WireRequest):
    """PATCH /console/runs/{run_id}: a field left out is left as it is; name "" clears the name."""

    name: str | None = Field(default=None, max_length=10_000)
    tags: list[str] | None = Field(default=None, max_length=1_000)


class RunLabelsResponse(WireResponse):
    name: str | None
    tags: list[str]


class ConsoleRuns(WireResponse):
    runs: list[ConsoleRun]
    total: int


class MetricColumns(WireResponse):
    """The run's recorded calls, one list per field (index i of every list is call i), oldest first."""

    seq: list[int] = Field(description="the run's recorded calls, numbered from 1")
    step: list[int] = Field(description="the optimizer step each call belongs to")
    kind: list[str] = Field(description="forward_backward | forward | optim_step")
    finished: list[float] = Field(description="unix seconds")
    seconds: list[float] = Field(description="time on the trainer")
    tokens: list[int] = Field(description="target tokens of the call")
    total_tokens: list[int] = Field(description="target tokens the run trained on so far")
    metrics: dict[str, list[float | None]] = Field(
        description="name -> one value per call (null where the call has none): loss_per_token, loss_sum, "
        "loss_weight, tokens_per_s, grad_norm, learning_rate, an RL loss's ratio_mean, kl_sampler_trainer, "
        "clip_fraction, advantage_mean, advantage_abs_mean, sampled_tokens, a custom loss's own")


class RunMetrics(WireResponse):
    run: ConsoleRun
    calls: MetricColumns
    last_seq: int = Field(description="ask again with after_seq=last_seq for what comes next")


class ConsoleCheckpoint(WireResponse):
    run_id: str
    checkpoint_id: str
    kind: str = Field(description="weights | sampler_weights | external_weights")
    tinker_path: str
    owner: str
    created_at: datetime
    size_bytes: int
    expires_at: datetime | None
    public: bool


class ConsoleCheckpoints(WireResponse):
    checkpoints: list[ConsoleCheckpoint]
    total: int


class ConsoleSession(WireResponse):
    session_id: str
    owner: str
    created_at: datetime
    last_heartbeat: datetime
    display_name: str | None
    status: str = Field(description="active | idle (open, but no heartbeat for 30 s: its client has exited) | "
                        "client_finished | cancelled")
    reason: str | None
    runs: int
    samplers: int


class ConsoleSessions(WireResponse):
    sessions: list[ConsoleSession]
    total: int


class TimelineSpan(WireResponse):
    request_id: str
    kind: str
    track: str = Field(description="the training run or sampler it belongs to")
    submitted: float = Field(description="unix seconds")
    started: float | None = Field(description="when it started running; null if it never ran")
    finished: float
    failed: bool


class ConsoleSessionDetail(WireResponse):
    session: ConsoleSession
    run_ids: list[str]
    sampler_ids: list[str]
    spans: list[TimelineSpan]


class ConsoleEngine(WireResponse):
    name: str
    state: str = Field(description="absent | starting | awake | asleep | down | external")
    pid: int | None
    url: str | None
    weight_versions: list[str] = Field(description="the weight versions (adapters) it holds, oldest first")
    running: int
    waiting: int
    generated_tokens: int
    tokens_per_s: float | None = Field(description="generated tokens per second since the previous read")
    restarts: int
    transport: str | None
    device: str | None
    problem: str | None


class ConsoleEngineGroup(WireResponse):
    base_model: str
    state: str
    engines: list[ConsoleEngine]


class ConsoleEngines(WireResponse):
    groups: list[ConsoleEngineGroup]
    restarts: int = Field(description="engine processes replaced after a failure, all groups")
    gpu_memory: dict[str, int] | None = Field(description="free and total bytes of the trainer's GPU, if any")


class PlaygroundModels(WireResponse):
    base_models: list[str]
    sampler_checkpoints: list[ConsoleCheckpoint] = Field(description="the caller's own sampler weights")


class ChatTurn(WireRequest):
    role: Literal["system", "user", "assistant"]
    content: Annotated[str, Field(max_length=100_000)]


PLAYGROUND_COUNTS = {"messages": 64, "tokens": 32_768, "stop": 8}  # each list's most items, counted first


class PlaygroundRequest(WireRequest):
    model: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        description="a served base model, or a tinker:// path to sampler weights the key may read")
    messages: Annotated[list[ChatTurn], Field(max_length=PLAYGROUND_COUNTS["messages"])] | None = Field(
        None, description="a chat, rendered with the model's chat template")
    text: Annotated[str, Field(max_length=100_000)] | None = Field(None, description="raw text, tokenized")
    tokens: Annotated[list[Annotated[int, Field(ge=0, lt=2**31)]],
                      Field(max_length=PLAYGROUND_COUNTS["tokens"])] | None = Field(
        None, description="raw token ids")
    max_tokens: Annotated[int, Field(ge=1, le=1024)] = 32
    temperature: Annotated[float, Field(ge=0, le=10)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1, le=1_000_000)] = -1
    seed: Annotated[int, Field(ge=0, lt=2**31)] | None = None
    n: Annotated[int, Field(ge=1, le=8)] = 1
    stop: Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]],
                    Field(max_length=PLAYGROUND_COUNTS["stop"])] = []

    @model_validator(mode="before")
    @classmethod
    def _counted(cls, data: Any) -> Any:
        return counted_first(data, PLAYGROUND_COUNTS)


class SampledToken(WireResponse):
    id: int
    text: str = Field(description="the text this token adds")
    logprob: float


class PlaygroundSample(WireResponse):
    text: str
    tokens: list[SampledToken]
    finish_reason: str = Field(description="stop | length")


class PlaygroundResponse(WireResponse):
    prompt_tokens: int
    samples: list[PlaygroundSample]
