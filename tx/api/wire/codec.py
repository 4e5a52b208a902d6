"""Protobuf <-> domain: the forward_backward request, and the two results that travel as protobuf.

docs/wire-contract.md#protobuf-bodies: forward_backward bodies are `ForwardBackwardRequest` messages (optionally zstd),
and `retrieve_future` must answer forward/forward_backward and sample results with serialized
`ForwardBackwardOutput` / `SampleResponse`. Every number in a bytes field is little-endian:
tokens int32, tensors in their DType, CSR indices and batched offsets int64.

Decoding treats the body as untrusted: anything malformed is a `UserError`. Encoding takes
domain results built by tx itself, so a bad result is a `ValueError` (a server bug).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import zstandard
from google.protobuf.message import DecodeError

from tx.api.wire import tinker_public_pb2 as pb
from tx.api.wire.prompt_scores import alt_tokens, target_tensor
from tx.api.wire.tensors import densify_csr, reshape_dense
from tx.multimodal.audio import decode_dmel
from tx.types import (
    IMAGE_FORMATS,
    Chunk,
    Datum,
    ForwardBackwardInput,
    ForwardBackwardResult,
    ImageChunk,
    ModelInput,
    ProvenanceSpan,
    SampledSequence,
    SampleResult,
    StopReason,
    TextChunk,
    UserError,
    is_image_format,
)

PROTOBUF_CONTENT_TYPE = "application/x-protobuf"

# A decompressed forward_backward body larger than this is refused.
MAX_DECOMPRESSED_BYTES = 1 << 30

# Sentinel of an empty top-k cell (the SDK's TopkLogprobs.MASK_LOGPROB).
TOPK_EMPTY_TOKEN = 0
TOPK_EMPTY_LOGPROB = -99999.0

# Wire dtype -> (how its bytes read, what the domain gets).
_WIRE_DTYPES: dict[int, tuple[np.dtype, np.dtype]] = {
    pb.DTYPE_FLOAT32: (np.dtype("<f4"), np.dtype(np.float32)),
    pb.DTYPE_INT64: (np.dtype("<i8"), np.dtype(np.int64)),
    pb.DTYPE_INT32: (np.dtype("<i4"), np.dtype(np.int64)),
    pb.DTYPE_BFLOAT16: (np.dtype("<u2"), np.dtype(np.float32)),
}

_STOP_REASONS = {StopReason.STOP: pb.STOP_REASON_STOP, StopReason.LENGTH: pb.STOP_REASON_LENGTH}


# ---------------------------------------------------------------------------------------------
# forward_backward request -> domain


def decode_forward_backward_request(
    body: bytes, content_encoding: str | None, *, zstd_enabled: bool
) -> tuple[str, int, ForwardBackwardInput]:
    """Decode a POST /api/v1/forward_backward body into (model_id, seq_id, input)."""
    msg = parse_forward_backward_request(body, content_encoding, zstd_enabled=zstd_enabled)
    return msg.model_id, msg.seq_id, forward_backward_input_from_proto(msg)


def parse_forward_backward_request(
    body: bytes, content_encoding: str | None, *, zstd_enabled: bool
) -> pb.ForwardBackwardRequest:
    """The request message, its model_id and seq_id checked; its data not yet decoded."""
    raw = decode_content_encoding(body, content_encoding, zstd_enabled=zstd_enabled)
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise UserError(f"forward_backward body is not a ForwardBackwardRequest protobuf: {exc}") from exc
    if not msg.model_id:
        raise UserError("forward_backward request has no model_id")
    if msg.seq_id < 1:
        raise UserError(f"forward_backward seq_id must be >= 1, got {msg.seq_id}")
    return msg


def forward_backward_input_from_proto(msg: pb.ForwardBackwardRequest) -> ForwardBackwardInput:
    if not msg.loss_fn:
        raise UserError("forward_backward request has no loss_fn")
    if not msg.data:
        raise UserError("forward_backward request has no data: send at least one datum")
    data = [_datum_from_proto(datum, index) for index, datum in enumerate(msg.data)]
    return ForwardBackwardInput(
        data=data,
        loss_fn=msg.loss_fn,
        loss_fn_config=_loss_fn_config_from_proto(msg),
        forward_only=msg.forward_only,
    )


def decode_content_encoding(body: bytes, content_encoding: str | None, *, zstd_enabled: bool) -> bytes:
    """Undo `Content-Encoding` (none, identity, or zstd when the server asked clients for it)."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise UserError(f"unsupported Content-Encoding {content_encoding!r}: send zstd or none")
    if not zstd_enabled:
        raise UserError("zstd Content-Encoding is not enabled on this server (proto_compress_fwdbwd)")
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True) as reader:
            raw = reader.read(MAX_DECOMPRESSED_BYTES + 1)
    except zstandard.ZstdError as exc:
        raise UserError(f"body is not valid zstd: {exc}") from exc
    if len(raw) > MAX_DECOMPRESSED_BYTES:
        raise UserError(f"decompressed body is larger than {MAX_DECOMPRESSED_BYTES} bytes")
    return raw


def _loss_fn_config_from_proto(msg: pb.ForwardBackwardRequest) -> dict[str, float | str]:
    """The legacy numbers-only map, overridden by v2 entries (numbers or text) where present."""
    config: dict[str, float | str] = {key: float(value) for key, value in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        kind = value.WhichOneof("value")
        if kind == "number":
            config[key] = float(value.number)
        elif kind == "text":
            config[key] = value.text
        else:
            raise UserError(f"loss_fn_config[{key!r}] holds neither a number nor text")
    return config


def _datum_from_proto(msg: pb.Datum, index: int) -> Datum:
    try:
        if not msg.model_input:
            raise UserError("model_input is empty")
        chunks = tuple(_numbered_chunk(chunk, number) for number, chunk in enumerate(msg.model_input))
        inputs = {
            name: tensor_from_proto(tensor, f"loss_fn_inputs[{name!r}]")
            for name, tensor in msg.loss_fn_inputs.items()
        }
        spans = tuple(_span_from_proto(span) for span in msg.loss_fn_input_spans)
    except UserError as exc:
        raise UserError(f"datum {index}: {exc}") from exc
    # model_input_spans parse but are not used: the losses read only the target rows' provenance.
    return Datum(model_input=ModelInput(chunks=chunks), loss_fn_inputs=inputs, loss_fn_input_spans=spans)


def _span_from_proto(msg: pb.ProvenanceSpan) -> ProvenanceSpan:
    kind = msg.WhichOneof("span")
    if kind is None:
        raise UserError("a provenance span is neither prompt_tokens nor sampled_tokens")
    span = getattr(msg, kind)
    if span.offset < 0 or span.length < 0:
        raise UserError(f"provenance span offset and length must be >= 0, got {span.offset}, {span.length}")
    return ProvenanceSpan(span.sequence_id, int(span.offset), int(span.length), kind == "sampled_tokens")


def _numbered_chunk(msg: pb.Chunk, number: int) -> Chunk:
    try:
        return _chunk_from_proto(msg)
    except UserError as exc:
        raise UserError(f"chunk {number}: {exc}") from None


def _chunk_from_proto(msg: pb.Chunk) -> Chunk:
    kind = msg.WhichOneof("chunk")
    if kind == "encoded_text":
        tokens = _array_from_bytes(msg.encoded_text.tokens, np.dtype("<i4"), "encoded_text tokens")
        return TextChunk(tokens=tuple(tokens.tolist()))
    if kind == "image":
        image = msg.image
        expected = image.expected_tokens if image.HasField("expected_tokens") else None
        return image_chunk(bytes(image.data), image.format, expected)
    if kind == "dmel":
        return decode_dmel(bytes(msg.dmel.dmel))
    raise UserError("a model_input chunk has no content")


def image_chunk(data: bytes, image_format: str, expected_tokens: int | None) -> ImageChunk:
    """Validate one image chunk (shared with the JSON path)."""
    if not is_image_format(image_format):
        raise UserError(f"image format must be one of {list(IMAGE_FORMATS)}, got {image_format!r}")
    if not data:
        raise UserError("image chunk has no data")
    if expected_tokens is not None and expected_tokens < 0:
        raise UserError(f"image expected_tokens must be >= 0, got {expected_tokens}")
    return ImageChunk(data=data, format=image_format, expected_tokens=expected_tokens)


def tensor_from_proto(msg: pb.Tensor, what: str = "tensor") -> np.ndarray:
    """A dense numpy array (int64 or float32) from a proto Tensor; CSR pads with 0."""
    if msg.dtype not in _WIRE_DTYPES:
        raise UserError(f"{what}: unsupported dtype {msg.dtype}")
    wire_dtype, _ = _WIRE_DTYPES[msg.dtype]
    shape = tuple(int(dim) for dim in msg.shape)
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        values = _widen(_array_from_bytes(csr.values, wire_dtype, f"{what} CSR values"), msg.dtype)
        crow = _array_from_bytes(csr.crow_indices, np.dtype("<i8"), f"{what} crow_indices")
        col = _array_from_bytes(csr.col_indices, np.dtype("<i8"), f"{what} col_indices")
        return densify_csr(values, crow, col, shape, pad_value=0, what=what)
    flat = _widen(_array_from_bytes(msg.dense, wire_dtype, what), msg.dtype)
    return reshape_dense(flat, shape, what)


def _array_from_bytes(buf: bytes, dtype: np.dtype, what: str) -> np.ndarray:
    if len(buf) % dtype.itemsize:
        raise UserError(f"{what}: {len(buf)} bytes is not a whole number of {dtype.itemsize}-byte values")
    return np.frombuffer(buf, dtype=dtype)


def _widen(values: np.ndarray, wire_dtype: int) -> np.ndarray:
    """Wire values -> the domain's int64 / float32, as a fresh writable native-endian array."""
    if wire_dtype == pb.DTYPE_BFLOAT16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(_WIRE_DTYPES[wire_dtype][1])


# ---------------------------------------------------------------------------------------------
# ForwardBackwardResult -> ForwardBackwardOutput bytes


def encode_forward_backward_output(result: ForwardBackwardResult) -> bytes:
    """Serialize a forward/forward_backward result as the SDK's ForwardBackwardOutput."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=result.loss_fn_output_type)
    for key, value in result.metrics.items():
        if key.count(":") != 1:
            raise ValueError(f"metric key {key!r} must have the form 'name:reduction'")
        msg.metrics[key] = float(value)
    outputs = [{name: _as_output_array(name, arr) for name, arr in d.items()} for d in result.loss_fn_outputs]
    if outputs:
        names = set(outputs[0])
        for index, datum in enumerate(outputs):
            if set(datum) != names:
                raise ValueError(f"datum {index} outputs {sorted(datum)}, datum 0 outputs {sorted(names)}")
    for run in _runs_of_equal_layout(outputs):
        msg.loss_fn_outputs.append(_array_record(run, result.loss_fn_output_type))
    return msg.SerializeToString()


def _as_output_array(name: str, array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind == "f":
        array = array.astype("<f4", copy=False)
    elif array.dtype.kind in "iub":
        array = array.astype("<i8", copy=False)
    else:
        raise ValueError(f"output {name!r} has dtype {array.dtype}; only numbers can be sent")
    return array.reshape(1) if array.ndim == 0 else array


def _layout(datum: dict[str, np.ndarray]) -> tuple:
    return tuple((name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(datum.items()))


def _runs_of_equal_layout(outputs: list[dict[str, np.ndarray]]) -> list[list[dict[str, np.ndarray]]]:
    """Consecutive datums that share dtypes and trailing shapes go into one ArrayRecord."""
    runs: list[list[dict[str, np.ndarray]]] = []
    for datum in outputs:
        if runs and _layout(runs[-1][0]) == _layout(datum):
            runs[-1].append(datum)
        else:
            runs.append([datum])
    return runs


def _array_record(run: list[dict[str, np.ndarray]], type_tag: str) -> pb.ArrayRecord:
    record = pb.ArrayRecord(type_tag=type_tag, num_datums=len(run))
    for name in run[0]:
        record.fields[name].CopyFrom(_batched_tensor([datum[name] for datum in run]))
    return record


def _batched_tensor(arrays: Sequence[np.ndarray]) -> pb.BatchedTensor:
    byte_sizes = [arr.nbytes for arr in arrays]
    offsets = np.concatenate([[0], np.cumsum(byte_sizes)]).astype("<i8")
    dtype = pb.DTYPE_FLOAT32 if arrays[0].dtype.kind == "f" else pb.DTYPE_INT64
    return pb.BatchedTensor(
        data=b"".join(np.ascontiguousarray(arr).tobytes() for arr in arrays),
        offsets=offsets.tobytes(),
        dtype=dtype,
        trailing_shape=list(arrays[0].shape[1:]),
    )


# ---------------------------------------------------------------------------------------------
# SampleResult -> SampleResponse bytes


def encode_sample_response(result: SampleResult) -> bytes:
    """Serialize a sample result as the SDK's SampleResponse."""
    msg = pb.SampleResponse(prompt_cache_hit_tokens=0)
    for sequence in result.sequences:
        msg.sequences.append(_sampled_sequence(sequence))
    if result.prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(result.prompt_logprobs, dtype="<f4").ravel().tobytes()
    if result.topk_prompt_logprobs is not None:
        token_ids, logprobs = result.topk_prompt_logprobs
        msg.topk_prompt_logprobs.CopyFrom(_topk_logprobs(token_ids, logprobs))
    if result.target_prompt_logprobs is not None:
        msg.target_prompt_logprobs.CopyFrom(target_tensor(result.target_prompt_logprobs))
    if result.prompt_alt_tokens is not None:
        msg.prompt_alt_tokens.CopyFrom(alt_tokens(*result.prompt_alt_tokens))
    return msg.SerializeToString()


def _sampled_sequence(sequence: SampledSequence) -> pb.SampledSequence:
    msg = pb.SampledSequence(
        stop_reason=_STOP_REASONS[StopReason(sequence.stop_reason)],
        tokens=np.asarray(sequence.tokens, dtype="<i4").tobytes(),
    )
    if len(sequence.logprobs):
        if len(sequence.logprobs) != len(sequence.tokens):
            raise ValueError(f"{len(sequence.logprobs)} logprobs for {len(sequence.tokens)} sampled tokens")
        msg.logprobs = np.asarray(sequence.logprobs, dtype="<f4").tobytes()
    if sequence.topk is not None:
        msg.topk_sampled_logprobs.CopyFrom(_topk_logprobs(*sequence.topk))
    return msg


def _topk_logprobs(token_ids: np.ndarray, logprobs: np.ndarray) -> pb.TopkLogprobs:
    """Row-major [n, k] matrices; a NaN logprob or negative id marks an empty cell."""
    token_ids = np.asarray(token_ids, dtype=np.int64)
    logprobs = np.asarray(logprobs, dtype=np.float32)
    if token_ids.ndim != 2 or token_ids.shape != logprobs.shape:
        raise ValueError(
            f"top-k token ids {token_ids.shape} and logprobs {logprobs.shape} must both be [n, k]"
        )
    empty = np.isnan(logprobs) | (token_ids < 0)
    token_ids = np.where(empty, TOPK_EMPTY_TOKEN, token_ids)
    logprobs = np.where(empty, np.float32(TOPK_EMPTY_LOGPROB), logprobs)
    length, k = token_ids.shape
    return pb.TopkLogprobs(
        token_ids=token_ids.astype("<i4").tobytes(),
        logprobs=logprobs.astype("<f4").tobytes(),
        k=k,
        length=length,
    )
