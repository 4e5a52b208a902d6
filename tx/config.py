"""One typed settings object for the whole server.

Values come from, in order of precedence: CLI flags (`tx serve --flag`), `TX_*` environment
variables, then the defaults below. The CLI only fills fields of this object; there is no other
way to configure tx.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_MODEL = "tiny-qwen3"

# The names settings choose between, on the ground floor so that every component imports them from here.
EngineKindName = Literal["embedded", "vllm"]  # each kind's record: tx/inference/engines/kinds.py
Dtype = Literal["float32", "bfloat16", "float16"]  # base weights' dtype; LoRA, optimizer, logprobs stay float32
ShardBase = Literal["auto", "always", "never"]  # trainer workers: shard the frozen base with FSDP2?


def default_train_dtype(device: str) -> Dtype:
    """The trainer's default dtype for a `--device` value, without importing torch unless it is "auto"."""
    if device == "auto":
        import torch

        return "bfloat16" if torch.cuda.is_available() else "float32"
    return "bfloat16" if device.startswith("cuda") else "float32"


def _engine_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"engine URL {url!r} must start with http:// or https://")
    return url


def default_data_dir() -> Path:
    return Path.home() / ".tx"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TX_", extra="forbid")

    host: str = Field("127.0.0.1", description="Address the API binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API binds (0 = any free port).")
    data_dir: Path = Field(default_factory=default_data_dir, description="Checkpoints, store, models.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default a SQLite file in the data directory."
    )
    base_models: list[str] = Field(
        default_factory=list,
        description="Base models to serve: local directories or hub ids in the HF cache. "
        f"Empty = the built-in offline model {DEFAULT_MODEL!r}.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted API keys (each must start with 'tml-'). Empty = any 'tml-' key, "
        "allowed only when bound to loopback.",
    )
    operator_keys: list[str] = Field(
        default_factory=list,
        description="Keys for operator routes (/metrics, /api/v1/tx/engines) when API keys are set; sent as X-API-Key or "
        "Authorization: Bearer. With API keys set and no operator key, those routes are refused.",
    )
    backend: Literal["torch", "jax"] = Field(
        "torch", description="Training backend: torch, or jax (the [jax] extra; text models only)."
    )
    device: str = Field("auto", description="Training device: auto, cpu, cuda, cuda:N.")
    trainer_workers: int = Field(
        1, ge=1, le=1024,
        description="Trainer worker processes training one model together (one GPU each on a GPU machine; see "
        "trainer_shard_base). 1 = the trainer runs inside the server process.",
    )
    trainer_shard_base: Literal["auto", "always", "never"] = Field(
        "auto", description="With trainer workers: shard the frozen base over them with FSDP2 (always), hold it "
        "whole on each and sum the LoRA gradients once per step (never), or shard only a base that does not fit "
        "(auto: more than half a GPU's memory, or on CPU N copies over half the RAM).",
    )
    train_micro_batch_tokens: int | None = Field(
        None, ge=1, description="Tokens per trainer micro-batch (a longer sequence runs alone). Default: 8192 "
        "on CPU; on CUDA derived from free memory and the model's size.",
    )
    train_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="Dtype of the trainer's base weights (LoRA weights, AdamW state, logprobs and losses "
        "stay float32). Default: bfloat16 on CUDA, float32 on CPU.",
    )
    gradient_checkpointing: bool | None = Field(
        None, description="Recompute decoder activations in backward (less memory, ~1/3 more compute). "
        "Default: on with CUDA, off on CPU.",
    )
    train_max_sequence_tokens: int | None = Field(
        None, ge=1, description="Longest datum the trainer accepts; longer ones are refused as a user error. "
        "Default: the model's context length.",
    )
    long_poll_s: float = Field(30.0, gt=0, le=40, description="How long retrieve_future holds a poll.")
    seq_gap_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long a model's queue waits for a missing seq_id before skipping it.",
    )
    session_timeout_s: float = Field(
        900.0, gt=0, description="A session with no heartbeat this long is finished and its models freed."
    )
    janitor_interval_s: float = Field(
        60.0, gt=0, description="How often expired futures, checkpoints and sessions are cleaned up."
    )
    future_ttl_s: float = Field(3600.0, gt=0, description="How long finished results are kept.")
    public_url: str | None = Field(
        None, description="Base URL clients reach this server at, used in signed download links "
        "(default: the URL each request came in on)."
    )
    download_link_ttl_s: float = Field(
        3600.0, gt=0, le=7 * 24 * 3600, description="How long signed download links stay valid."
    )
    sample_use_retrieve_futures: bool = Field(
        False, description="Ask clients to wait for samples with one retrieve_futures long-poll per sampler "
        "instead of one retrieve_future per sample (scripts/bench/retrieve_futures.py measures both)."
    )
    proto_compress_fwdbwd: bool = Field(False, description="Ask clients to zstd forward_backward bodies.")
    max_request_bytes: int = Field(
        200 << 20, gt=0, description="Largest body of forward_backward and asample (batches, images)."
    )
    max_json_bytes: int = Field(4 << 20, gt=0, description="Largest body of any other route.")
    engine: EngineKindName = Field(
        "embedded", description="Inference engine: the embedded transformers engine, or vLLM (the [vllm] extra)."
    )
    engine_count: int | None = Field(
        None, ge=0, le=64, description="Inference engines tx starts per served base model. Default: 1, or 0 for a "
        "base model that has external engines (--engine-url).",
    )
    engine_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="External engines (`tx engine serve`, started by someone else) by URL; each serves the base "
        "model its /health fingerprint matches. tx never starts, stops or sleeps them. In TX_ENGINE_URLS: "
        "comma-separated or a JSON list.",
    )
    engine_secret: SecretStr | None = Field(
        None, description="The external engines' cluster secret (their TX_ENGINE_SECRET); needed with engine_urls."
    )
    engine_probe_interval_s: float = Field(
        2.0, gt=0, le=300, description="How often an external engine that stopped answering is probed again."
    )
    engine_tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine.")
    engine_memory_share: float | None = Field(
        None, gt=0, le=1, description="Share of each GPU's memory a vLLM engine may use (vLLM's default if unset)."
    )
    engine_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None,
        description="Base weights' dtype of engines (embedded and vLLM). Default: the trainer's "
        "(--train-dtype), so sampled logprobs match the trainer's.",
    )
    engine_colocate: bool | None = Field(
        None,
        description="Engines share the trainer's accelerator: they sleep during training passes. "
        "Default: true when a CUDA GPU is present, else false.",
    )
    engine_training_wait_s: float = Field(
        5.0, ge=0, description="How long a training pass on a colocated accelerator waits for in-flight samples "
        "before pausing them (they resume after the pass).",
    )
    engine_sleep_level: int = Field(1, ge=1, le=2, description="1: keep weights off the accelerator; 2: drop them.")
    engine_max_adapters: int = Field(8, ge=1, description="Weight versions an engine keeps loaded.")
    sampler_versions_kept: int = Field(
        8, ge=1, description="Sampler weight versions held per run (every save, also under a name saved before, "
        "is a new version; unnamed ones are also kept on disk); older sampling clients then fail."
    )
    ray_address: str | None = Field(
        None, description="Place engines as Ray actors on this cluster ('auto', 'host:port', 'local' "
        "for a Ray started by tx). Needs the [ray] extra. Unset: local processes."
    )
    sampling_max_queue: int = Field(1024, ge=1, description="Samples in flight before asample answers 429.")
    image_max_bytes: int = Field(20 << 20, ge=1, description="Largest image (or image asset), in bytes.")
    image_max_pixels: int = Field(
        4096 * 4096, ge=1, description="Largest image, in pixels (width x height, checked before decoding)."
    )
    asset_roots: list[Path] = Field(
        default_factory=list,
        description="Directories whose files image_asset_pointer may read (absolute paths or file:// URLs). "
        "Empty = no local files.",
    )
    asset_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts image_asset_pointer may fetch from over http(s): 'name' (any port) or "
        "'name:port'. "
        "Empty = no fetching.",
    )
    asset_allow_private: bool = Field(
        False,
        description="Let asset fetches reach loopback, private and link-local addresses (refused by default, "
        "checked after name resolution and on every redirect).",
    )
    asset_allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR) asset fetches may reach although not public, e.g. 10.1.2.0/24.",
    )
    asset_fetch_timeout_s: float = Field(10.0, gt=0, le=300, description="Time limit of one asset fetch.")

    @field_validator("api_keys")
    @classmethod
    def _keys_have_prefix(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key.startswith("tml-"):
                raise ValueError("every API key must start with 'tml-' (the tinker SDK requires it)")
        return keys

    @field_validator("engine_urls", mode="before")
    @classmethod
    def _urls_list(cls, value: object) -> object:
        if isinstance(value, str):  # from TX_ENGINE_URLS
            value = json.loads(value) if value.lstrip().startswith("[") else [u for u in value.split(",") if u.strip()]
        if isinstance(value, list):
            return [_engine_url(str(u)) for u in value]
        return value

    @field_validator("asset_allowed_networks")
    @classmethod
    def _networks_parse(cls, networks: list[str]) -> list[str]:
        for network in networks:
            ipaddress.ip_network(network, strict=False)  # ValueError names the bad one
        return networks

    @model_validator(mode="after")
    def _refuse_open_public_bind(self) -> Settings:
        if not self.api_keys and not is_loopback(self.host):
            raise ValueError(
                f"binding {self.host} needs API keys: set TX_API_KEYS or --api-key "
                "(any 'tml-' key is accepted only on loopback)"
            )
        return self

    @model_validator(mode="after")
    def _external_engines_need_secret(self) -> Settings:
        if self.engine_urls and self.engine_secret is None:
            raise ValueError("--engine-url needs the engines' cluster secret: set TX_ENGINE_SECRET or --engine-secret")
        if self.engine_count == 0 and not self.engine_urls:
            raise ValueError("--engine-count 0 leaves nothing to sample from: give --engine-url too")
        return self

    def managed_engine_count(self, has_external: bool) -> int:
        """Engines tx starts for one base model (see `engine_count`)."""
        if self.engine_count is not None:
            return self.engine_count
        return 0 if has_external else 1

    @property
    def resolved_engine_dtype(self) -> str:
        """--engine-dtype, or the trainer's dtype when unset."""
        if self.engine_dtype is not None:
            return self.engine_dtype
        if self.train_dtype is not None:
            return self.train_dtype
        return default_train_dtype(self.device)

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'tx.db'}"

    @property
    def checkpoints_dir(self) -> Path:
        return self.data_dir / "checkpoints"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
