"""One typed settings object for the whole server, with a section for each component it builds.

Values come from, in order of precedence: CLI flags (`tx serve --flag`), `TX_*` environment
variables, then the defaults below. The CLI only fills fields of this object; there is no other
way to configure tx.

`Settings` holds the server's own fields (address, keys, store, limits, timeouts) and five sections
(`sections.py`): `trainer` (`TrainerSection`, read by `tx/backends/`), `engines` (`EngineSection`, read by
`tx/inference/`), `images` (`ImagesSection`, read by `tx/multimodal/`), `audio` (`AudioSection`, likewise) and
`quotas` (`QuotaSection`, read by `tx/core/quotas.py`). A component takes its section, not `Settings`.
`names.py` holds the names settings choose between (engine kinds, dtypes).

Names stay flat for users. A section's field is set under its flat name, which is its `validation_alias`
(or its own name when it has none): `--train-dtype` and `TX_TRAIN_DTYPE` set `trainer.dtype`, as in the
README's configuration tables, and `Settings(train_dtype=...)` works too. `flat_names()` lists them all.
Imports: pydantic only (the ground floor).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from tx.config.sections import (
    AudioSection,
    EngineSection,
    ImagesSection,
    QuotaSection,
    Section,
    TrainerSection,
    pairs_of,
)

DEFAULT_MODEL = "tiny-qwen3"


logger = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077
"""`tx serve`'s umask: what it writes (the store, checkpoints, exports, logs) is its user's alone."""


OWNER_ID = re.compile(r"[0-9a-f]{32}")  # a key's owner id (tx/api/auth.py's owner_of), as the console shows it
_KEY_LABEL = re.compile(r"[\w .@()+/-]{1,64}")


def _key_labels(value: object) -> object:
    """{key or owner id: label} from "k=label,k2=label2" (TX_KEY_LABELS), ["k=label", ...] (repeated flags),
    JSON or a dict; each label 1-64 letters, digits, spaces or ._-@()+/."""
    value = pairs_of(value, "a key label is KEY=LABEL", lambda key: f"{key[:8]!r}...")  # never a whole key
    if isinstance(value, dict):
        for key, label in value.items():
            if not (str(key).startswith("tml-") or OWNER_ID.fullmatch(str(key))):
                raise ValueError("a key label names an API key ('tml-...') or a key's owner id (32 hex digits, "
                                 "as the console shows it)")
            if not _KEY_LABEL.fullmatch(str(label)):
                raise ValueError(f"key label {str(label)[:80]!r}: 1-64 letters, digits, spaces or ._-@()+/")
    return value


KeyLabels = Annotated[dict[str, str], NoDecode, BeforeValidator(_key_labels)]


def default_data_dir() -> Path:
    return Path.home() / ".tx"


def make_private_dir(path: Path) -> None:
    """Make the data directory `path` 0700 (docs/security.md#the-data-directory): created so; an existing one
    of this user's with access for others tightened, with a log line; one of another user's left as it is,
    with a warning."""
    path = Path(path)
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode goes through the umask
        return
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o077:
        return
    if info.st_uid != os.getuid():
        logger.warning("data directory %s (mode %o) belongs to another user: its mode is left as it is",
                       path, mode)
        return
    os.chmod(path, 0o700)
    logger.warning("data directory %s was mode %o: made 0700 (only its owner reads the store, checkpoints)",
                   path, mode)


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
        description="Base models to serve: local directories or hub ids (org/name, org/name@revision), downloaded "
        "into the HF cache before the server is ready when absent. "
        f"Empty = the built-in offline model {DEFAULT_MODEL!r}.",
    )
    offline: bool = Field(
        False, description="Download no model: a hub id must already be in the HF cache (as HF_HUB_OFFLINE=1 does).",
    )
    debug: bool = Field(False, description="A refusal at start prints its traceback too (else: one line).")
    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted API keys (each must start with 'tml-'). Empty = any 'tml-' key, "
        "allowed only when bound to loopback.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Names the server answers besides loopback's and its own address (the Host header; "
        "a defence against DNS rebinding, docs/security.md). On a non-loopback bind, giving any turns the check "
        "on. '*' answers every name.",
    )
    operator_keys: list[str] = Field(
        default_factory=list,
        description="Keys for operator routes (/metrics, /api/v1/tx/engines) when API keys are set; sent as "
        "X-API-Key or Authorization: Bearer. With API keys and no operator key, those routes are refused.",
    )
    key_labels: KeyLabels = Field(
        default_factory=dict,
        description="Names for keys (KEY=LABEL; KEY an accepted key or its owner id): an operator's console shows "
        "each labelled key's rows under its label instead of its owner id. In TX_KEY_LABELS: comma-separated.",
    )
    jwt_auth: bool = Field(
        True, description="Clients exchange their API key for a short-lived signed token (POST /api/v1/auth/token) "
        "and send that instead, as the tinker SDK does when a server enables it; keys keep working too.",
    )
    jwt_ttl_s: float = Field(900.0, ge=1, le=24 * 3600, description="Lifetime of an exchanged token, in seconds.")
    audit_max_entries: int = Field(100_000, ge=1, description="Audit log entries kept per key (its newest).")
    audit_retention_days: float = Field(90.0, gt=0, description="Audit log entries older than this are dropped.")
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
    sample_join_sampling_session: bool = Field(
        True, description="An unpickled SamplingClient asks the server for its number in the sampling session "
        "(join_sampling_session) instead of drawing one at random, so no two clients' seq_ids can collide.",
    )
    max_request_bytes: int = Field(
        200 << 20, gt=0, description="Largest body of forward_backward and asample (batches, images)."
    )
    max_json_bytes: int = Field(4 << 20, gt=0, description="Largest body of any other route.")
    console: bool = Field(True, description="Serve the web console at /console (its JSON routes stay on).")
    sampling_max_queue: int = Field(1024, ge=1, description="Samples in flight before asample answers 429.")
    prompt_workers: int = Field(
        2, ge=1, le=64, description="Processes that render chat templates and tokenize the text prompts of the "
        "OpenAI-compatible routes and the playground (off the server's interpreter: docs/security.md).")
    sampling_dispatch_rows: int | None = Field(
        None, ge=1, description="Sequences in flight at one base model's engines at once; the rest wait, and are "
        "let through a key at a time by fair share. Default: twice the engines' batch, per engine.",
    )
    cpu_threads: int | None = Field(
        None, ge=1, le=4096, description="CPU threads the trainer and the engines tx starts on this machine share "
        "(tx/cpu.py; the trainer's and engines' sections say how they split). Default: the CPUs this process "
        "may run on.",
    )
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="The trainer.")
    engines: EngineSection = Field(default_factory=EngineSection, description="The inference engines.")
    images: ImagesSection = Field(default_factory=ImagesSection, description="Images in inputs.")
    audio: AudioSection = Field(default_factory=AudioSection, description="Audio in inputs.")
    quotas: QuotaSection = Field(default_factory=QuotaSection, description="What each API key may hold.")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, FlatEnvSource(settings_cls), dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _sections_from_flat_names(cls, data: Any) -> Any:
        """Move each flat name given at the top level (`train_dtype=...`, a flag) into its section."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, section in sections(cls).items():
            flat = {key: data.pop(key) for key in section.flat_names() if key in data}
            if flat:
                given = data.get(name) or {}
                if isinstance(given, BaseModel):
                    given = given.model_dump(exclude_unset=True)
                data[name] = {**given, **flat}
        return data

    @field_validator("api_keys")
    @classmethod
    def _keys_have_prefix(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key.startswith("tml-"):
                raise ValueError("every API key must start with 'tml-' (the tinker SDK requires it)")
        return keys

    @model_validator(mode="after")
    def _refuse_open_public_bind(self) -> Settings:
        if not self.api_keys and not is_loopback(self.host):
            raise ValueError(
                f"binding {self.host} needs API keys: set TX_API_KEYS or --api-key "
                "(any 'tml-' key is accepted only on loopback)"
            )
        return self

    @model_validator(mode="after")
    def _labels_name_accepted_keys(self) -> Settings:
        accepted = {*self.api_keys, *self.operator_keys}
        unknown = [key for key in self.key_labels if key.startswith("tml-") and key not in accepted]
        if unknown and self.api_keys:
            raise ValueError(f"key_labels names a key the server does not accept ({unknown[0][:8]}...): "
                             "label keys given with --api-key or --operator-key")
        return self

    @model_validator(mode="after")
    def _trainer_labels_need_ray(self) -> Settings:
        if self.trainer.node_labels and self.engines.ray_address is None:
            raise ValueError("trainer_node_labels places trainer workers on Ray nodes: set --ray-address too")
        return self

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'tx.db'}"

    @property
    def checkpoints_dir(self) -> Path:
        return self.data_dir / "checkpoints"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


def sections(settings_cls: type[BaseModel]) -> dict[str, type[Section]]:
    """{field name: section type} of the settings' sections."""
    return {name: field.annotation for name, field in settings_cls.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, Section)}


def flat_names() -> list[str]:
    """Every name a user sets: `--name` (dashed) on the command line, TX_NAME in the environment."""
    plain = [name for name in Settings.model_fields if name not in sections(Settings)]
    return plain + [flat for section in sections(Settings).values() for flat in section.flat_names()]


class FlatEnvSource(EnvSettingsSource):
    """The TX_* variables, a section's fields under their flat names (TX_TRAIN_DTYPE for `trainer.dtype`)."""

    def __call__(self) -> dict[str, Any]:
        nested = sections(self.settings_cls)
        data = {key: value for key, value in super().__call__().items() if key not in nested}
        for name, section in nested.items():
            values = {}
            for flat, field_name in section.flat_names().items():
                raw = self.env_vars.get(self._apply_case_sensitive(f"{self.env_prefix}{flat}"))
                if raw is None:
                    continue
                field = section.model_fields[field_name]
                try:
                    values[flat] = self.prepare_field_value(flat, field, raw, False)
                except ValueError as exc:
                    raise SettingsError(f"error parsing {self.env_prefix}{flat.upper()}: {exc}") from exc
            if values:
                data[name] = values
        return data


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
