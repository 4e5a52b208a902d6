"""The domain's own types, shared by every layer below the HTTP API.

Three type families are kept apart in tx:

- wire schemas (`tx/api/wire/`) mirror the tinker SDK exactly, optionals and all;
- these domain types carry what the core, the trainer and the engines need, already
  validated, with numpy arrays instead of wire encodings;
- database rows (`tx/store/`) are separate again.

The API layer converts wire -> domain explicitly; nothing below it sees a wire object.
Tensors are numpy arrays: int64 for token ids, float32 for everything else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, Union, get_args

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image


class UserError(ValueError):
    """Bad input from a user: reported with category "user" (or a 4xx), never retried."""


class NotFoundError(LookupError):
    """A resource the caller named does not exist, or does not belong to the caller."""


class ConflictError(RuntimeError):
    """The request conflicts with the current state (e.g. a checkpoint name already taken)."""


class OverloadedError(RuntimeError):
    """Too much queued work; the client should back off and retry (HTTP 429)."""


class QuotaExceededError(UserError):
    """One of a key's quotas is full (`tx/core/quotas.py`). `transient`: it frees by itself as queued work runs
    (HTTP 429 with Retry-After); otherwise only the key frees it, by finishing sessions or deleting checkpoints,
    or the operator, by raising the setting (HTTP 403). The message names the quota and its setting."""

    def __init__(self, message: str, *, quota: str, transient: bool) -> None:
        super().__init__(message)
        self.quota = quota
        self.transient = transient


class ErrorCategory(str, Enum):
    USER = "user"
    SERVER = "server"
    UNKNOWN = "unknown"


# ---- ids: each built here, in one format, and never parsed back (read the fields instead)


def model_id_for(session_id: str, model_seq_id: int) -> str:
    """A training run's id: the session's model number `model_seq_id`."""
    return f"{session_id}:train:{model_seq_id}"


def sampler_id_for(session_id: str, sampling_session_seq_id: int) -> str:
    """A sampling session's id: the session's sampler number `sampling_session_seq_id`."""
    return f"{session_id}:sample:{sampling_session_seq_id}"


@dataclass(frozen=True)
class SampleKey:
    """One sample call: its sampling session and seq_id. Engines route on `sampler_id` (a session's
    requests share an engine); `str(key)` names the call (the engines' X-Session-ID header)."""

    sampler_id: str
    seq_id: int

    def __str__(self) -> str:
        return f"{self.sampler_id}:{self.seq_id}"


@dataclass(frozen=True)
class TextChunk:
    tokens: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.tokens)


ImageFormat = Literal["png", "jpeg"]  # an image chunk's declared encoding (either decoder reads either)
IMAGE_FORMATS: tuple[ImageFormat, ...] = get_args(ImageFormat)


def is_image_format(value: str) -> TypeGuard[ImageFormat]:
    return value in IMAGE_FORMATS


@dataclass(frozen=True)
class ImageChunk:
    """Raw image bytes (already base64-decoded) as sent by the client."""

    data: bytes
    format: ImageFormat
    expected_tokens: int | None = None


@dataclass(frozen=True)
class ImageAssetPointer:
    location: str
    format: ImageFormat
    expected_tokens: int | None = None


@dataclass(frozen=True, eq=False)
class AudioChunk:
    """A DMel clip as the client sent it (`data`: the SDK's TensorContainer bytes) and its header as read and
    checked (`tx.multimodal.audio.decode_dmel`): its shape (frames, mel bins), the dtype of its values, where
    they start in `data` and whether it is constant (one value, broadcast). One frame is one placeholder token of
    the model (docs/model-families.md#audio-in). Its values are read only by `levels`, once the caps have passed."""

    data: bytes
    frames: int
    bins: int
    dtype: str  # the values' numpy dtype: "u1", "<i4" or "<i8"
    start: int  # where the values start in `data`
    constant: bool = False

    @property
    def length(self) -> int:
        """Frames: the tokens the chunk takes, as the SDK counts them (`DmelChunk.length`, dim 0)."""
        return self.frames

    @property
    def expected_tokens(self) -> int:
        return self.length

    def levels(self) -> np.ndarray:
        """The clip's values, (frames, bins), in the dtype they came in: a read-only view of `data` (a constant
        clip's one value broadcast), so nothing is copied or widened until the model takes them as ids."""
        count = 1 if self.constant else self.frames * self.bins
        values = np.frombuffer(self.data, dtype=self.dtype, count=count, offset=self.start)
        if self.constant:
            return np.broadcast_to(values, (self.frames, self.bins))
        return values.reshape(self.frames, self.bins)


Chunk = Union[TextChunk, ImageChunk, ImageAssetPointer, AudioChunk]


@dataclass(frozen=True)
class ModelInput:
    chunks: tuple[Chunk, ...]

    @classmethod
    def from_tokens(cls, tokens: list[int] | tuple[int, ...]) -> ModelInput:
        return cls(chunks=(TextChunk(tuple(int(t) for t in tokens)),))

    @property
    def has_images(self) -> bool:
        return any(isinstance(c, (ImageChunk, ImageAssetPointer)) for c in self.chunks)

    @property
    def has_audio(self) -> bool:
        return any(isinstance(c, AudioChunk) for c in self.chunks)

    @property
    def is_text(self) -> bool:
        return all(isinstance(c, TextChunk) for c in self.chunks)

    def text_tokens(self) -> list[int]:
        """All tokens of a text-only input; a UserError if it holds images or audio."""
        if self.has_images:
            raise UserError("this model takes text only: the input holds image chunks")
        if self.has_audio:
            raise UserError("this model takes text only: the input holds audio (dmel) chunks")
        return [t for c in self.chunks if isinstance(c, TextChunk) for t in c.tokens]


@dataclass(frozen=True)
class ProvenanceSpan:
    """A run of `length` positions that came from sequence `sequence_id` (its sampled tokens when
    `sampled`, else its prompt), starting at `offset` in that part."""

    sequence_id: str
    offset: int
    length: int
    sampled: bool


@dataclass(frozen=True)
class StabilityRecord:
    """What the server recorded of one sampled sequence (`record_stability_info`), for StableReinforce: the
    sampled tokens (int64) and the sampler's logprob of each (float32), the prompt's length, the base model and
    the weights version that sampled it (None: the base model's own weights)."""

    sequence_id: str
    base_model: str
    weights_version: int | None
    prompt_length: int
    tokens: np.ndarray
    logprobs: np.ndarray


@dataclass
class Datum:
    model_input: ModelInput
    loss_fn_inputs: dict[str, np.ndarray]
    # runs tiling the rows of loss_fn_inputs["target_tokens"], in order; empty when none were sent
    loss_fn_input_spans: tuple[ProvenanceSpan, ...] = ()


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 32
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def validate(self) -> None:
        if not 1 <= self.rank <= 1024:
            raise UserError(f"lora rank must be in [1, 1024], got {self.rank}")
        if not (self.train_attn or self.train_mlp or self.train_unembed):
            raise UserError("at least one of train_attn, train_mlp, train_unembed must be true")


@dataclass
class ForwardBackwardInput:
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False
    custom_loss: CustomLoss | None = None  # the stored loss that loss_fn "custom" names, looked up at submission


@dataclass(frozen=True)
class CustomLoss:
    """A loss uploaded with create_custom_loss: a torch.fx trace as plain data, and its inputs.

    `inputs` are (name, rank) pairs, logprobs first, then the loss_fn_inputs keys it reads; `nodes`
    are the graph's nodes as sent (`CustomLossNode` dicts). Only a backend turns them into code."""

    loss_id: str
    session_id: str
    name: str
    inputs: tuple[tuple[str, int], ...]
    nodes: tuple[dict[str, Any], ...]


@dataclass
class ForwardBackwardResult:
    """Per-datum outputs (name -> array, e.g. "logprobs") and `name:reduction` metrics."""

    loss_fn_outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]
    loss_fn_output_type: str = "TensorData"


@dataclass
class OptimStepResult:
    metrics: dict[str, float]


@dataclass(frozen=True)
class BaseLogprobs:
    """The trainer's base model on some token sequences (no adapter): per sequence, the logprob of each token
    given the ones before it (position 0 has none, so a row is one shorter than its sequence), and the most two
    runs of the model may differ on such a logprob (`tx.models.agreement.token_tolerance` of its dtype). What
    an engine's self-check compares its prompt logprobs with (`tx/inference/manager/selfcheck.py`)."""

    logprobs: list[list[float]]
    tolerance: float


@dataclass(frozen=True)
class BaseModelInfo:
    """What the server tells clients about a base model it serves."""

    name: str
    arch: str
    tokenizer_id: str
    vocab_size: int
    max_context_length: int


class StopReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"


MAX_SAMPLES_PER_REQUEST = 1024  # `num_samples` of one sample call; every engine accepts this many
MAX_TOPK_PROMPT_LOGPROBS = 1024  # also the most top-k per sampled token, and distinct target_prompt_logprobs ids
MAX_PROMPT_ALT_CELLS = 1 << 20  # len(prompt) x prompt_alt_tokens_k of one request


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    stop_at_eos: bool = True


@dataclass(frozen=True)
class PlacedImage:
    """One image of an expanded input: its pixels, its encoded bytes and the placeholder span it fills."""

    image: Image
    data: bytes
    format: ImageFormat
    offset: int
    num_tokens: int


@dataclass(frozen=True, eq=False)
class PlacedAudio:
    """One audio clip of an expanded input: its levels ((frames, mel bins), in the dtype the client sent) and the placeholder span it
    fills (one token per frame)."""

    levels: np.ndarray
    offset: int

    @property
    def num_tokens(self) -> int:
        return int(self.levels.shape[0])


@dataclass(frozen=True)
class ExpandedInput:
    """A model input as the model sees it: token ids with image and audio placeholders, and the images and
    audio clips filling them."""

    token_ids: list[int]
    images: tuple[PlacedImage, ...] = ()
    audio: tuple[PlacedAudio, ...] = ()

    def image_mask(self) -> list[int]:
        """`mm_token_type_ids`: 1 at image placeholder positions, 0 at text."""
        mask = [0] * len(self.token_ids)
        for placed in self.images:
            mask[placed.offset : placed.offset + placed.num_tokens] = [1] * placed.num_tokens
        return mask


@dataclass(frozen=True)
class TargetTokens:
    """target_prompt_logprobs: `ids` [len(prompt) - 1, K] (int64, -1 = none), row i scored at prompt position i + 1;
    `csr` the (row pointers, column indices) the request named them by, which the answer keeps (None: dense)."""

    ids: np.ndarray
    csr: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class TargetLogprobs:
    """The answer to TargetTokens: `values` [len(prompt) - 1, K] float32 (0.0 where no id was named), laid out as
    the request was (`csr`: its row pointers and column indices; None: dense)."""

    values: np.ndarray
    csr: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class SampleRequest:
    """One sample call, from the API's edge to the engine client's (one object all the way; `tx/api/wire` and
    `tx/inference/manager/client.py` convert it at the two edges). `expanded` is the prompt as the model sees
    it, set by the core once its images are fetched and expanded; None for a text-only prompt."""

    prompt: ModelInput
    num_samples: int
    params: SamplingParams
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool = False  # record every sampled sequence for StableReinforce (core/sampling/records.py)
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: TargetTokens | None = None
    prompt_alt_tokens_k: int = 0
    expanded: ExpandedInput | None = None

    def model_input(self) -> ExpandedInput:
        """The prompt's token ids (with image placeholders) and images, as the engines take them."""
        return self.expanded if self.expanded is not None else ExpandedInput(self.prompt.text_tokens())


@dataclass(frozen=True)
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    topk: tuple[np.ndarray, np.ndarray] | None = None  # (token ids, logprobs) [len(tokens), k], when asked for


@dataclass
class SampleResult:
    """`prompt_logprobs` has one entry per prompt position, NaN where there is none (position 0,
    or positions before `prompt_logprobs_last_n`). `topk_prompt_logprobs` is (token_ids, logprobs),
    each of shape [len(prompt), k], when asked for. `prompt_alt_tokens` is (token ids, logprobs), each
    [len(prompt) - 1, k]."""

    sequences: list[SampledSequence]
    prompt_logprobs: np.ndarray | None = None
    topk_prompt_logprobs: tuple[np.ndarray, np.ndarray] | None = None
    weights_version: int | None = None  # the weight version the engine sampled with (None: the base model's)
    target_prompt_logprobs: TargetLogprobs | None = None
    prompt_alt_tokens: tuple[np.ndarray, np.ndarray] | None = None


# Hears a sample's tokens as they are generated: (sample index, new token ids, their raw logprobs).
TokenListener = Callable[[int, list[int], list[float]], None]
