"""Audio in model inputs: the SDK's DMel chunks decoded, checked and placed (docs/model-families.md#audio-in).

A client sends DMel tokens (discretized mel-spectrogram levels), never audio files: the server decodes no WAV,
MP3 or FLAC and runs no ffmpeg or soundfile on user data. A `DmelChunk` carries a serialized TensorContainer:
an optional constant marker byte (254: one value, broadcast), a dtype byte (2: int32, 3: int64, 4: uint8, all
little-endian; the other dtype bytes are not integers and are refused), a varint rank, varint dims, then the
data. A clip is rank 2, (frames, mel bins); each frame is one placeholder token of the model, so the chunk's
length is its frame count, as the SDK counts it (`DmelChunk.length`, dim 0).

Decoding reads the header only (`decode_dmel`): the caps on a request's clips (`check_audio_caps`, the audio
quota) are read off every clip's header and byte length before any clip's values are read, and the values are
then viewed in the dtype they came in (`AudioChunk.levels`: the range check runs on uint8 as sent), widened to
int64 only as one micro-batch's ids (`audio_inputs`).

Whether a model takes audio is read from the model itself, never from a list of family names: its config has
an `audio_config` with `n_mel_bins` and `mel_vocab_size` and an `audio_token_id`, and its transformers class's
forward takes `audio_input_ids` (`AudioSpec.load`). Its audio tower embeds every frame alone (Inkling sums one
embedding per mel bin), so the clips of a micro-batch go to the model as one frame per row, in placeholder
order, and packing and fusing need nothing more; `frames_apart` checks that property when a model loads.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tx.types import AudioChunk, UserError

if TYPE_CHECKING:
    import torch

CONSTANT_MARKER = 254
DTYPES: dict[int, np.dtype] = {2: np.dtype("<i4"), 3: np.dtype("<i8"), 4: np.dtype("u1")}
_DTYPE_NAMES = {2: "int32", 3: "int64", 4: "uint8"}
MAX_CLIP_VALUES = 1 << 24
"""Most values (frames x mel bins) one clip may hold, checked on its header before anything is allocated: a
constant clip (a marker and one value) names its shape in a few bytes, so the shape alone would let a request
make any size of array (30,000 frames x 512 bins fit)."""


@dataclass(frozen=True)
class AudioLimits:
    """The caps on one request's audio: frames (placeholder tokens) and TensorContainer bytes, over all its
    clips (all of a sampling prompt's; all of one training datum's)."""

    max_frames: int = 30_000
    max_bytes: int = 8 << 20


def decode_dmel(data: bytes) -> AudioChunk:
    """A DmelChunk's TensorContainer bytes as an `AudioChunk`: its header read and checked against the bytes, its
    values not read (`AudioChunk.levels` views them once the caps have passed); a UserError saying what is wrong
    (the caller names the chunk)."""
    if not data:
        raise UserError("dmel chunk has no data")
    offset, constant = (1, True) if data[0] == CONSTANT_MARKER else (0, False)
    if offset >= len(data):
        raise UserError("dmel data is truncated in its header")
    code = data[offset]
    if code not in DTYPES:
        raise UserError(f"dmel dtype byte {code} is not an integer dtype: DMel levels are uint8 (4), int32 (2) "
                        "or int64 (3)")
    rank, offset = _varint(data, offset + 1)
    if rank != 2:
        raise UserError(f"dmel tensor has rank {rank}; a clip is rank 2: (frames, mel bins)")
    frames, offset = _varint(data, offset)
    bins, offset = _varint(data, offset)
    if frames < 1 or bins < 1:
        raise UserError(f"dmel tensor has shape ({frames}, {bins}); a clip needs at least one frame and one bin")
    if frames * bins > MAX_CLIP_VALUES:
        raise UserError(f"dmel tensor ({frames}, {bins}) holds {frames * bins} values; a clip holds at most "
                        f"{MAX_CLIP_VALUES}")
    dtype = DTYPES[code]
    count = 1 if constant else frames * bins
    size = len(data) - offset
    if size != count * dtype.itemsize:
        raise UserError(f"dmel data holds {size} bytes after its header; a {_DTYPE_NAMES[code]} "
                        f"({frames}, {bins}) tensor{' (constant)' if constant else ''} takes "
                        f"{count * dtype.itemsize}")
    return AudioChunk(data=bytes(data), frames=frames, bins=bins, dtype=dtype.str, start=offset, constant=constant)


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data):
            raise UserError("dmel data is truncated in its header")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 63:
            raise UserError("dmel header holds a varint over 64 bits")


@dataclass(frozen=True)
class AudioSpec:
    """What a model takes as audio: its placeholder token, its mel bins and its levels (0..levels-1)."""

    token_id: int
    mel_bins: int
    levels: int

    @classmethod
    def of_config(cls, config: dict[str, Any]) -> AudioSpec | None:
        """From a config.json (as a dict): None unless it has an audio config with bins, levels and a token."""
        audio = config.get("audio_config")
        if not isinstance(audio, dict) or config.get("audio_token_id") is None:
            return None
        bins, levels = audio.get("n_mel_bins"), audio.get("mel_vocab_size")
        if not isinstance(bins, int) or not isinstance(levels, int):
            return None
        return cls(int(config["audio_token_id"]), bins, levels)

    @classmethod
    def load(cls, model_dir: Path) -> AudioSpec | None:
        """The audio the model in `model_dir` takes, or None: its config says it and its class's forward takes
        `audio_input_ids`."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        spec = cls.of_config(config)
        if spec is None or not _forward_takes_audio(config.get("architectures") or []):
            return None
        return spec

    def check(self, chunk: AudioChunk) -> None:
        """A UserError unless `chunk`'s levels fit this model: its bins and its level range (read in the dtype the
        client sent: nothing is widened)."""
        self.check_levels(chunk.levels())

    def check_levels(self, levels: np.ndarray) -> None:
        """`check` of a clip's levels, (frames, bins)."""
        bins = levels.shape[1]
        if bins != self.mel_bins:
            raise UserError(f"dmel clip has {bins} mel bins; this model takes {self.mel_bins}")
        low, high = int(levels.min()), int(levels.max())
        if low < 0 or high >= self.levels:
            bad = low if low < 0 else high
            raise UserError(f"dmel clip holds level {bad}; this model takes levels in [0, {self.levels})")

    def check_text(self, tokens: Sequence[int] | np.ndarray) -> None:
        """A UserError when text holds the audio placeholder token: the model would take it for a frame."""
        if self.token_id in tokens:
            raise UserError(f"text holds the audio placeholder token {self.token_id}: the model would take it for "
                            "an audio frame; send audio as dmel chunks")


def _forward_takes_audio(architectures: list[str]) -> bool:
    import transformers

    for name in architectures:
        model_class = getattr(transformers, name, None)
        if model_class is not None and "audio_input_ids" in inspect.signature(model_class.forward).parameters:
            return True
    return False


@functools.lru_cache(maxsize=32)
def audio_spec(model_dir: Path) -> AudioSpec | None:
    """`AudioSpec.load`, once per model directory."""
    return AudioSpec.load(Path(model_dir))


def check_audio_caps(chunks: list[AudioChunk], limits: AudioLimits) -> None:
    """A UserError when one request's (or datum's) clips together pass the frame or byte cap: read off their
    headers and byte lengths, before any clip's values are."""
    frames = sum(chunk.length for chunk in chunks)
    size = sum(len(chunk.data) for chunk in chunks)
    if frames > limits.max_frames:
        raise UserError(f"{frames} audio frames are over this server's cap of {limits.max_frames} per request "
                        "(--audio-max-frames)")
    if size > limits.max_bytes:
        raise UserError(f"{size} bytes of dmel data are over this server's cap of {limits.max_bytes} per request "
                        "(--audio-max-bytes)")


def audio_inputs(clips: list[np.ndarray], device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """`audio_input_ids` for the model: every frame of `clips` (each (frames, bins), in placeholder order) as a
    (total frames, 1, bins) tensor, one frame per row (the tower embeds frames alone: `frames_apart`); the one
    place the levels become int64, one micro-batch's (or prefill's) clips at a time."""
    import torch

    frames = torch.from_numpy(np.concatenate(clips)).to(torch.long)[:, None, :]
    return {"audio_input_ids": frames if device is None else frames.to(device)}


def check_frames_apart(model: torch.nn.Module, model_dir: Path) -> None:
    """A RuntimeError when the model in `model_dir` takes audio but its tower does not embed frames alone: tx's
    way of feeding clips (`audio_inputs`) would then be wrong, so the model does not load (run when the trainer
    and the embedded engine load a model)."""
    spec = audio_spec(Path(model_dir))
    if spec is not None and not frames_apart(model, spec):
        raise RuntimeError(f"{model_dir}: the model's audio tower does not embed frames one by one; tx feeds clips "
                           "frame by frame (docs/model-families.md#audio-in) and cannot serve it")


def frames_apart(model: torch.nn.Module, spec: AudioSpec) -> bool:
    """Whether `model`'s audio features of a clip are those of its frames taken one by one (what `audio_inputs`
    relies on); checked once when a model that takes audio loads."""
    import torch

    base = getattr(model, "get_base_model", None)
    core = base() if callable(base) else model
    inner = core.get_submodule("model") if isinstance(core, torch.nn.Module) else None
    get = getattr(inner, "get_audio_features", None)
    if not callable(get):
        return False
    generator = torch.Generator().manual_seed(0)
    clip = torch.randint(0, spec.levels, (2, 5, spec.mel_bins), generator=generator)
    device = next(model.parameters()).device
    with torch.no_grad():
        whole = _features(get(clip.to(device)))
        apart = _features(get(clip.reshape(-1, 1, spec.mel_bins).to(device)))
    whole, apart = whole.reshape(-1, whole.shape[-1]), apart.reshape(-1, apart.shape[-1])
    return whole.shape == apart.shape and bool(torch.equal(whole, apart))


def _features(output: Any) -> torch.Tensor:
    """The hidden states of a `get_audio_features` output (transformers' `BaseModelOutputWithPooling`)."""
    import torch

    hidden = getattr(output, "last_hidden_state", None)
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"get_audio_features returned {type(output).__name__}, without last_hidden_state")
    return hidden
