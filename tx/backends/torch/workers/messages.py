"""The control channel between the API process and its trainer workers: typed JSON, tensors as safetensors.

Every message is a `Request` or a `Reply` (pydantic, JSON on the wire) plus an optional binary payload
that is a safetensors file (LoRA tensors, optimizer moments). Nothing is unpickled on either side. A frame
on a byte stream is: 8-byte big-endian header length, the JSON header, 8-byte payload length, the payload.

Datums travel as JSON too (`WireDatum`): token chunks as lists, images and arrays as base64 with their
dtype and shape, so a worker rebuilds exactly the `tx.types.Datum` the API decoded.
"""

from __future__ import annotations

import base64
import dataclasses
import struct
from typing import IO, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from tx.config.sections import TrainerSection
from tx.multimodal.audio import decode_dmel
from tx.optimizers import AdamParams
from tx.types import (
    AudioChunk,
    Chunk,
    Datum,
    ForwardBackwardInput,
    ImageAssetPointer,
    ImageChunk,
    ImageFormat,
    LoraConfig,
    ModelInput,
    ProvenanceSpan,
    TextChunk,
)

Op = Literal[
    "hello",
    "join",
    "create_model",
    "delete_model",
    "forward_backward",
    "forward_backward_many",
    "optim_step",
    "read_lora",
    "read_state",
    "write_state",
    "threads",
    "base_logprobs",
]
_LENGTH = struct.Struct(">Q")
_DTYPES = {"float32", "float64", "float16", "int64", "int32", "bool"}
ErrorKind = Literal["", "user", "not_found", "conflict", "server"]  # how the API process maps a failure


class WireArray(BaseModel):
    dtype: str
    shape: list[int]
    b64: str

    @classmethod
    def of(cls, array: np.ndarray) -> WireArray:
        array = np.ascontiguousarray(array)
        return cls(
            dtype=str(array.dtype), shape=list(array.shape), b64=base64.b64encode(array.tobytes()).decode()
        )

    def array(self) -> np.ndarray:
        if self.dtype not in _DTYPES:
            raise ValueError(f"array dtype {self.dtype!r} is not allowed on the control channel")
        return np.frombuffer(base64.b64decode(self.b64), dtype=self.dtype).reshape(self.shape).copy()


class WireChunk(BaseModel):
    kind: Literal["text", "image", "asset", "audio"]
    tokens: list[int] = Field(default_factory=list)
    data_b64: str = ""
    location: str = ""
    format: ImageFormat = "png"  # read only for image and asset chunks
    expected_tokens: int | None = None

    @classmethod
    def of(cls, chunk: Chunk) -> WireChunk:
        if isinstance(chunk, TextChunk):
            return cls(kind="text", tokens=list(chunk.tokens))
        if isinstance(chunk, AudioChunk):
            return cls(kind="audio", data_b64=base64.b64encode(chunk.data).decode())
        if isinstance(chunk, ImageChunk):
            return cls(
                kind="image",
                data_b64=base64.b64encode(chunk.data).decode(),
                format=chunk.format,
                expected_tokens=chunk.expected_tokens,
            )
        return cls(
            kind="asset", location=chunk.location, format=chunk.format, expected_tokens=chunk.expected_tokens
        )

    def chunk(self) -> Chunk:
        if self.kind == "text":
            return TextChunk(tuple(self.tokens))
        if self.kind == "audio":
            return decode_dmel(base64.b64decode(self.data_b64))
        if self.kind == "image":
            return ImageChunk(base64.b64decode(self.data_b64), self.format, self.expected_tokens)
        return ImageAssetPointer(self.location, self.format, self.expected_tokens)


class WireSpan(BaseModel):
    sequence_id: str
    offset: int
    length: int
    sampled: bool


class WireDatum(BaseModel):
    chunks: list[WireChunk]
    inputs: dict[str, WireArray]
    spans: list[WireSpan] = Field(default_factory=list)

    @classmethod
    def of(cls, datum: Datum) -> WireDatum:
        return cls(
            chunks=[WireChunk.of(c) for c in datum.model_input.chunks],
            inputs={k: WireArray.of(v) for k, v in datum.loss_fn_inputs.items()},
            spans=[WireSpan(**dataclasses.asdict(span)) for span in datum.loss_fn_input_spans],
        )

    def datum(self) -> Datum:
        return Datum(
            ModelInput(tuple(c.chunk() for c in self.chunks)),
            {k: v.array() for k, v in self.inputs.items()},
            tuple(ProvenanceSpan(**span.model_dump()) for span in self.spans),
        )


class WireBatch(BaseModel):
    data: list[WireDatum]
    loss_fn: str
    loss_fn_config: dict[str, float | str] = Field(default_factory=dict)
    forward_only: bool = False

    @classmethod
    def of(cls, batch: ForwardBackwardInput, data: list[Datum]) -> WireBatch:
        """`batch` with its datums replaced by `data` (this worker's share)."""
        return cls(
            data=[WireDatum.of(d) for d in data],
            loss_fn=batch.loss_fn,
            loss_fn_config=dict(batch.loss_fn_config),
            forward_only=batch.forward_only,
        )

    def batch(self) -> ForwardBackwardInput:
        return ForwardBackwardInput(
            [d.datum() for d in self.data], self.loss_fn, dict(self.loss_fn_config), self.forward_only
        )


class WireCall(BaseModel):
    """One run's share of a forward_backward_many (several runs' calls in one pass where they share a base)."""

    model_id: str
    batch: WireBatch


class WireLora(BaseModel):
    rank: int
    seed: int
    train_attn: bool
    train_mlp: bool
    train_unembed: bool

    def lora(self) -> LoraConfig:
        return LoraConfig(self.rank, self.seed, self.train_attn, self.train_mlp, self.train_unembed)


class WireAdam(BaseModel):
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float

    def adam(self) -> AdamParams:
        return AdamParams(**self.model_dump())


class WorkerSpec(BaseModel):
    """What every worker of a group is started with (its rank comes separately)."""

    world_size: int
    models: dict[str, str]  # served name -> model directory (the same path on every node)
    device: str = "auto"  # as configured: auto, cpu, cuda, cuda:N
    threads: int = 0  # torch CPU threads; 0 = torch's default
    trainer: TrainerSection = Field(default_factory=TrainerSection)  # dtype, micro-batch budget, ...


class Request(BaseModel):
    op: Op
    model_id: str = ""
    base_model: str = ""
    lora: WireLora | None = None
    batch: WireBatch | None = None
    calls: list[WireCall] = Field(default_factory=list)  # forward_backward_many
    adam: WireAdam | None = None
    address: str = ""  # hello: the host to open the rendezvous store on; join: that store's host:port
    token: str = Field(default="", repr=False)  # hello, join: what the rendezvous store asks (rendezvous.py)
    directory: str = ""  # write_state: the checkpoint the tensors came from (named in errors)
    optimizer_meta: dict[str, Any] | None = None  # param_groups of an AdamW state (write_state)
    threads: int = 0  # threads: each worker's torch CPU threads from now on (0: unchanged; replies with them)
    sequences: list[list[int]] = Field(default_factory=list)  # base_logprobs: the token sequences of base_model


class Reply(BaseModel):
    ok: bool = True
    error: str = ""
    error_kind: ErrorKind = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    outputs: list[dict[str, WireArray]] = Field(default_factory=list)
    optimizer_meta: dict[str, Any] | None = None
    address: str = ""  # hello: where this worker's rendezvous store listens (rank 0)
    calls: list[Reply] = Field(default_factory=list)  # forward_backward_many: each call's, in order
    logprobs: list[list[float]] = Field(default_factory=list)  # base_logprobs (rank 0): one row a sequence
    tolerance: float = 0.0  # base_logprobs (rank 0): the bound of the model's dtype (`BaseLogprobs`)


def write_frame(stream: IO[bytes], header: BaseModel, payload: bytes = b"") -> None:
    body = header.model_dump_json().encode()
    stream.write(_LENGTH.pack(len(body)) + body + _LENGTH.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes], kind: type[BaseModel]) -> tuple[Any, bytes]:
    """(header, payload); EOFError when the stream closed (the other side is gone)."""
    header = kind.model_validate_json(_read_exactly(stream, _LENGTH.unpack(_read_exactly(stream, 8))[0]))
    payload = _read_exactly(stream, _LENGTH.unpack(_read_exactly(stream, 8))[0])
    return header, payload


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size) if size else b""
    if len(data) != size:
        raise EOFError("control channel closed")
    return data
