"""DMel chunks decoded from the SDK's TensorContainer bytes, and a model's audio read from its config
(`tx/multimodal/audio.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from dmel_bytes import DTYPES, tensor_container, varint
from tinker.types import DmelChunk

from tx.multimodal.audio import AudioLimits, AudioSpec, check_audio_caps, decode_dmel
from tx.types import UserError


@pytest.mark.parametrize("dtype_byte", [2, 3, 4])
def test_levels_decode_in_every_integer_dtype_and_length_is_the_sdks(dtype_byte: int) -> None:
    levels = np.random.default_rng(0).integers(0, 200, size=(300, 80))  # 300 takes a two-byte varint
    data = tensor_container(levels, dtype_byte)
    chunk = decode_dmel(data)
    np.testing.assert_array_equal(chunk.levels(), levels)
    assert chunk.levels().dtype == np.dtype(DTYPES[dtype_byte])  # as sent: nothing widened
    assert chunk.length == DmelChunk(dmel=data).length == 300
    assert chunk.data == data


def test_a_constant_tensor_broadcasts_its_one_value() -> None:
    chunk = decode_dmel(tensor_container(np.full((5, 8), 3), constant=True))
    np.testing.assert_array_equal(chunk.levels(), np.full((5, 8), 3))


@pytest.mark.parametrize(("data", "words"), [
    (b"", "no data"),
    (b"\xfe", "truncated"),
    (bytes([1, 2, 3, 2]) + b"\x00" * 24, "dtype byte 1"),
    (bytes([4, 1, 3]) + b"\x00" * 3, "rank 1"),
    (bytes([4, 2, 0, 8]), "at least one frame"),
    (bytes([4, 2, 3]), "truncated"),
    (bytes([4, 2, 3, 2]) + b"\x00" * 5, "5 bytes after its header"),
    (bytes([4, 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80]), "over 64 bits"),
])
def test_bad_containers_are_user_errors(data: bytes, words: str) -> None:
    with pytest.raises(UserError, match=words):
        decode_dmel(data)


def test_a_model_checks_bins_levels_and_placeholders_in_text() -> None:
    spec = AudioSpec.of_config({"audio_token_id": 7, "audio_config": {"n_mel_bins": 8, "mel_vocab_size": 16}})
    assert spec == AudioSpec(7, 8, 16)
    spec.check(decode_dmel(tensor_container(np.full((2, 8), 15))))
    with pytest.raises(UserError, match="6 mel bins; this model takes 8"):
        spec.check(decode_dmel(tensor_container(np.zeros((2, 6), np.int64))))
    with pytest.raises(UserError, match=r"level 16; this model takes levels in \[0, 16\)"):
        spec.check(decode_dmel(tensor_container(np.full((2, 8), 16))))
    with pytest.raises(UserError, match="placeholder token 7"):
        spec.check_text(np.array([1, 7, 2]))
    assert AudioSpec.of_config({"vision_config": {}, "image_token_id": 3}) is None


def test_caps_count_every_clip_of_a_request() -> None:
    clips = [decode_dmel(tensor_container(np.zeros((10, 8), np.int64))) for _ in range(3)]
    check_audio_caps(clips, AudioLimits(max_frames=30, max_bytes=10_000))
    with pytest.raises(UserError, match="30 audio frames are over this server's cap of 29"):
        check_audio_caps(clips, AudioLimits(max_frames=29))
    with pytest.raises(UserError, match="--audio-max-bytes"):
        check_audio_caps(clips, AudioLimits(max_bytes=200))


def test_inklings_tower_embeds_frames_alone_and_a_mixing_one_is_refused(tmp_path) -> None:
    from transformers import AutoModelForImageTextToText

    from tx.models import write_tiny_model
    from tx.multimodal.audio import audio_spec, check_frames_apart, frames_apart

    model_dir = write_tiny_model(tmp_path / "inkling", preset="inkling", seed=0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    spec = audio_spec(model_dir)
    assert spec is not None and frames_apart(model, spec)
    check_frames_apart(model, model_dir)

    inner = model.model
    plain = inner.get_audio_features

    def mixing(audio_input_ids, *args, **kwargs):  # a tower whose frames see their clip: the clip's mean added
        out = plain(audio_input_ids, *args, **kwargs)
        hidden = out.last_hidden_state.reshape(*audio_input_ids.shape[:2], -1)
        out.last_hidden_state = (hidden + hidden.mean(dim=1, keepdim=True)).reshape(out.last_hidden_state.shape)
        return out

    inner.get_audio_features = mixing
    assert not frames_apart(model, spec)
    with pytest.raises(RuntimeError, match="frames one by one"):
        check_frames_apart(model, model_dir)


def test_the_embedded_engine_checks_each_clip_against_its_span() -> None:
    from tx.inference.engines.embedded.vision import batch_vision, prepare_audio, prepare_vision
    from tx.inference.protocol import GenerateRequest, PromptAudio
    from tx.multimodal import ImageLimits

    spec = AudioSpec(token_id=7, mel_bins=2, levels=4)
    levels = np.array([[0, 1], [2, 3], [3, 3]])

    def request(ids: list[int], offset: int = 1, clip: np.ndarray = levels) -> GenerateRequest:
        return GenerateRequest(prompt_token_ids=ids, audio=[PromptAudio.of(clip, offset)])

    vision = prepare_vision(request([5, 7, 7, 7, 6]), None, ImageLimits(), spec)
    assert vision is not None and vision.pixel_values is None
    np.testing.assert_array_equal(vision.audio[0], levels)
    other = prepare_vision(request([7, 7, 7], offset=0, clip=levels[::-1]), None, ImageLimits(), spec)
    inputs = batch_vision([vision, None, other], [0, 2, 2], 5)  # clips in row order, frames one per row
    assert set(inputs) == {"audio_input_ids"} and inputs["audio_input_ids"].shape == (6, 1, 2)
    np.testing.assert_array_equal(inputs["audio_input_ids"][:, 0].numpy(), np.concatenate([levels, levels[::-1]]))
    with pytest.raises(UserError, match="span does not hold 3 placeholder tokens"):
        prepare_audio(request([5, 7, 7, 6, 6]), spec)
    with pytest.raises(UserError, match="outside its clips"):
        prepare_audio(request([5, 7, 7, 7, 7]), spec)
    with pytest.raises(UserError, match="level 4"):
        prepare_audio(request([5, 7, 7, 7], clip=levels + 1), spec)
    with pytest.raises(UserError, match="takes no audio"):
        prepare_audio(request([5, 7, 7, 7]), None)


def test_packed_rows_feed_clips_in_the_order_of_their_placeholders() -> None:
    """A packed micro-batch may hold a later datum before an earlier one (first-fit decreasing): the frames go in
    the flattened rows' placeholder order, which is the order the model fills placeholders in."""
    import torch

    from tx.backends.losses import TARGET_KEY
    from tx.backends.torch.batch import PreparedDatum, build_micro_batch
    from tx.types import ExpandedInput, PlacedAudio

    token, items = 7, []
    for datum, (before, frames) in enumerate([(1, 2), (2, 4), (1, 1), (1, 3)]):  # lengths 3, 6, 2, 4
        levels = np.full((frames, 2), 10 * datum) + np.arange(frames)[:, None]  # each frame its own values
        ids = [1] * before + [token] * frames + [2] * (datum == 1)
        arrays = {TARGET_KEY: np.zeros(len(ids), np.int64)}
        items.append(PreparedDatum(ExpandedInput(ids, (), (PlacedAudio(levels, before),)), arrays))
    micro = build_micro_batch(items, torch.device("cpu"), packed=True)
    fed = micro.vision["audio_input_ids"][:, 0, 0].tolist()
    assert micro.input_ids.shape[0] == 3 and fed != sorted(fed)  # some datum sits before an earlier one
    flat = micro.input_ids.flatten().tolist()
    assert flat.count(token) == len(fed) == 10
    by_datum = {10 * d + f for d in range(4) for f in range(4)}
    assert set(fed) <= by_datum
    # walk the rows: the k-th placeholder met is filled by the k-th frame fed
    starts = sorted((seg.row * micro.input_ids.shape[1] + seg.start, seg.datum) for seg in _layout(items))
    expected = [10 * d + f for _, d in starts for f in range(items[d].expanded.audio[0].num_tokens)]
    assert fed == expected


def _layout(items):
    from tx.backends.torch.plan import pack_rows

    return pack_rows([item.num_tokens for item in items]).segments


def test_a_shape_past_the_clip_bound_is_refused_before_anything_is_allocated() -> None:
    """A constant clip names its shape in a few bytes: (10**12, 80) of one value allocated 582 TiB (a
    MemoryError, a 500) before the per-request caps were looked at."""
    huge = b"\xfe" + bytes([4]) + varint(2) + varint(10**12) + varint(80) + b"\x01"
    with pytest.raises(UserError, match="holds 80000000000000 values; a clip holds at most 16777216"):
        decode_dmel(huge)
    assert decode_dmel(b"\xfe" + bytes([4]) + varint(2) + varint(30_000) + varint(80) + b"\x01").levels().shape == (
        30_000, 80)  # a long clip of the default frame cap still decodes


def test_a_requests_caps_are_read_off_every_clips_header_before_any_clips_values(monkeypatch) -> None:
    """Issue 40: a forward_backward body's plain clips were widened to int64 as it decoded (8x their uint8 bytes:
    ~1.6 GiB for a 200 MiB body) before the caps were looked at, and datum 0's levels were read before datum 2's
    caps. Now decoding reads each clip's header only, and the quota and every datum's caps refuse the request
    (naming their flags) without one clip's values read."""
    import tracemalloc

    from tinker import types as sdk
    from tinker.proto.request_conv import forward_backward_request_to_proto

    from tx.api.wire.codec import decode_forward_backward_request
    from tx.backends.datums import DatumRules, check_batch
    from tx.core.quotas import QuotaExceededError
    from tx.core.training import check_audio_frames
    from tx.types import AudioChunk, BaseModelInfo

    rng = np.random.default_rng(0)
    good = rng.integers(0, 16, size=(1 << 17, 8)).astype(np.uint8)  # 1 MiB of uint8 levels a clip
    bad = good.copy()
    bad[5, 3] = 200  # past the model's 16 levels: reported only if datum 0's values are read first

    def datum(*clips: np.ndarray) -> sdk.Datum:
        chunks = [sdk.EncodedTextChunk(tokens=[10]), *(sdk.DmelChunk(dmel=tensor_container(c)) for c in clips)]
        return sdk.Datum(model_input=sdk.ModelInput(chunks=chunks), loss_fn_inputs={"target_tokens": [0]})

    request = sdk.ForwardBackwardRequest(forward_backward_input=sdk.ForwardBackwardInput(
        data=[datum(bad), datum(good), datum(good, good, good)], loss_fn="cross_entropy"), model_id="m", seq_id=1)
    body = forward_backward_request_to_proto(request).SerializeToString()

    reads = []
    plain_levels = AudioChunk.levels
    monkeypatch.setattr(AudioChunk, "levels", lambda chunk: reads.append(chunk) or plain_levels(chunk))
    tracemalloc.start()
    try:
        _, _, batch = decode_forward_backward_request(body, None, zstd_enabled=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(body), (peak, len(body))  # the clips' bytes once; widened they took 8x (40 MiB)

    with pytest.raises(QuotaExceededError, match="--quota-audio-frames-per-request"):
        check_audio_frames(batch, (3 << 17) - 1)  # datum 2 holds 3 x 2^17 frames
    rules = DatumRules(BaseModelInfo("m", "inkling", "m", 2048, 1 << 20), audio=AudioSpec(2046, 8, 16),
                       audio_limits=AudioLimits(max_frames=1 << 20, max_bytes=5 << 19))  # 2.5 MiB a datum
    with pytest.raises(UserError, match=r"datum 2: \d+ bytes of dmel data are over .*--audio-max-bytes"):
        check_batch(batch, rules)
    assert reads == []  # no clip's values were read
    with pytest.raises(UserError, match="datum 0: chunk 1: dmel clip holds level 200"):
        check_batch(batch, DatumRules(rules.info, audio=rules.audio, audio_limits=AudioLimits(1 << 20, 4 << 20)))
    assert reads  # under the caps, the values are read (as sent: uint8)
