"""tinker-cookbook 0.6.1's audio recipes, unchanged, against tx, offline (docs/cookbook.md#audio-recipes).

Every recipe runs through its own entry point (`python -m tinker_cookbook.recipes.audio...`) with its own
renderer (`tml_v0`, picked by model_info for `thinkingmachines/Inkling`), loss and sampling options
(temperature 1.0, the renderer's stop token); only sizes and steps shrink (clips, batch, group size, steps,
`max_tokens`). The model is the tiny Inkling at the real model's interface (`tx models make-tiny
thinkingmachines/Inkling --preset inkling_o200k`: the real vocabulary, special ids and 80-bin DMel), because the
cookbook renders with the real o200k tokenizer and the real DMel encoder of tml-renderers. Datasets are local
stand-ins of synthetic clips (`tests/cookbook_audio.py`).

- asr `sl_train` (LibriSpeech stand-in): SFT steps with DmelChunks, the WER evaluator samples, test/nll.
- asr `rl_train`: groups sampled from audio prompts, reward -WER, a step trained, checkpoints saved.
- emotion `prepare_data` (Expresso raw stand-in, ffmpeg from imageio-ffmpeg), then `sl_train`, `rl_train`
  warm-started from the SFT state, and `evaluate` on the SFT sampler checkpoint.
- medical_asr `train` (EkaCare stand-in): SFT with its entity metrics.

A refusal of the cookbook's chunks by tx (a 400 naming the datum and chunk) fails the recipe, and the test shows its
output and the server log's tail.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cookbook import (
    CookbookFixture,
    RecipeRun,
    assert_checkpoints_on_server,
    assert_finite,
    recipe_test_marks,
    run_recipe,
    start_tx_server,
)
from cookbook_audio import (
    EKACARE_ID,
    LIBRISPEECH_ID,
    write_ekacare_standin,
    write_expresso_manifests_standin,
    write_expresso_raw_standin,
    write_librispeech_standin,
)
from txserver import TxServer

pytestmark = [*recipe_test_marks(), pytest.mark.skipif(
    importlib.util.find_spec("tml_renderers") is None or importlib.util.find_spec("jiwer") is None,
    reason="the cookbook's audio recipes need tml-renderers and the audio extra (scripts/install_cookbook.sh)")]

MODEL = "thinkingmachines/Inkling"
PRESET = "inkling_o200k"
MAX_TOKENS = 8  # the recipes' 8192 lets a random model ramble for minutes on 2 cores
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
EXPRESSO_SPLITS = {"train": 12, "dev": 2, "test": 2}  # prepare_data: train -> sft_train + rl_train


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> CookbookFixture:
    return CookbookFixture.create(tmp_path_factory.mktemp("cookbook-audio"), models=[MODEL], preset=PRESET)


@pytest.fixture(scope="module")
def server(fixture: CookbookFixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with start_tx_server(fixture, tmp_path_factory.mktemp("tx-data"), env=SERVER_ENV) as srv:
        yield srv


def recipe(module: str, overrides: dict[str, Any], fixture: CookbookFixture, server: TxServer, name: str,
           timeout_s: float = 600) -> RecipeRun:
    """Run `module` on the tiny Inkling with `overrides`, in a fresh log_path named `name`."""
    return run_recipe(module, {"model_name": MODEL, **overrides}, fixture=fixture, server=server,
                      log_path=fixture.new_log_path(name), timeout_s=timeout_s, env=SERVER_ENV)


def ffmpeg_on_path(fixture: CookbookFixture) -> Path | None:
    """A folder with an `ffmpeg` (imageio-ffmpeg's binary), or None without imageio-ffmpeg."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        return None
    import imageio_ffmpeg

    folder = fixture.root / "bin"
    folder.mkdir(exist_ok=True)
    link = folder / "ffmpeg"
    if not link.exists():
        link.symlink_to(imageio_ffmpeg.get_ffmpeg_exe())
    return folder


def assert_trained(run: RecipeRun, steps: int) -> list[float]:
    """`steps` rows of finite train NLL; returns them."""
    nll = run.metric_series("train_mean_nll")
    assert len(nll) == steps, run.metrics()
    assert_finite(nll, "train_mean_nll")
    return nll


def test_every_id_the_tiny_model_samples_decodes(fixture: CookbookFixture) -> None:
    """The cookbook decodes every sampled token (rl.train prints each group); a random model samples its whole
    vocabulary, so the tiny Inkling has exactly the ids the cookbook's tokenizer decodes (CI once drew padding id
    200,101 of the real config's 201,024, and asr rl_train died in the tokenizer)."""
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    config = json.loads((fixture.add_model(MODEL, PRESET) / "config.json").read_text())
    vocab = config["text_config"]["vocab_size"]
    tokenizer = get_tokenizer(MODEL)
    tokenizer.decode(list(range(vocab - 64, vocab)))  # the specials at the top decode
    with pytest.raises(ValueError):
        tokenizer.decode([vocab])  # and the next id is past the tokenizer's


def test_asr_sl_train(fixture: CookbookFixture, server: TxServer) -> None:
    write_librispeech_standin(fixture.dataset_dir(LIBRISPEECH_ID), n_train=4, n_validation=2)
    run = recipe("tinker_cookbook.recipes.audio.asr.sl_train", {
        "n_train": 4, "n_eval": 2, "batch_size": 2, "num_epochs": 1, "max_steps": 2, "eval_every": 1,
        "max_tokens": MAX_TOKENS, "lora_rank": 4, "audio_cache_dir": fixture.root / "asr-clips"}, fixture, server,
        "asr-sl")
    assert_trained(run, 2)
    wer = run.metric_series("test/wer")
    assert wer and all(w >= 0 for w in wer), run.metrics()
    assert_finite(run.metric_series("test/nll"), "test/nll")
    rollouts = sorted(run._run_dir().glob("eval_rollouts_*.jsonl"))
    assert rollouts, "the WER evaluator wrote no rollouts"
    assert_checkpoints_on_server(server, run.checkpoints())


def test_asr_rl_train(fixture: CookbookFixture, server: TxServer) -> None:
    write_librispeech_standin(fixture.dataset_dir(LIBRISPEECH_ID), n_train=4, n_validation=2)
    run = recipe("tinker_cookbook.recipes.audio.asr.rl_train", {
        "n_train": 4, "n_eval": 2, "group_size": 2, "groups_per_batch": 2, "max_steps": 2, "eval_every": 1,
        "save_every": 1, "max_tokens": MAX_TOKENS, "lora_rank": 4, "audio_cache_dir": fixture.root / "asr-clips"},
        fixture, server, "asr-rl")
    rows = run.metrics()
    rewards = run.metric_series("env/all/reward/total")
    assert rewards and all(-1.0 <= r <= 0.0 for r in rewards), rows  # -min(WER, 1)
    assert run.metric_series("test/wer"), rows
    assert_checkpoints_on_server(server, run.checkpoints())


@pytest.fixture(scope="module")
def expresso(fixture: CookbookFixture) -> Path:
    """The emotion recipes' data_dir: made by the recipe's own prepare_data from a raw-release stand-in, or (no
    imageio-ffmpeg) written directly in its output layout."""
    if ffmpeg_on_path(fixture) is None:
        return write_expresso_manifests_standin(fixture.root / "expresso_16khz", {
            "sft_train": 6, "rl_train": 6, "dev": 2, "test": 2})
    write_expresso_raw_standin(fixture.root / "audio-data", EXPRESSO_SPLITS)
    run_recipe("tinker_cookbook.recipes.audio.emotion.prepare_data", {"data_path": fixture.root / "audio-data"},
               fixture=fixture, env={"PATH": f"{ffmpeg_on_path(fixture)}{os.pathsep}{os.environ['PATH']}"})
    return fixture.root / "audio-data" / "expresso_16khz"


def test_emotion_prepare_data(fixture: CookbookFixture, expresso: Path) -> None:
    if ffmpeg_on_path(fixture) is None:
        pytest.skip("emotion prepare_data transcodes with ffmpeg: install imageio-ffmpeg (scripts/install_cookbook.sh)")
    for split in ("sft_train", "rl_train", "dev", "test"):
        rows = [json.loads(line) for line in (expresso / f"{split}.jsonl").read_text().splitlines()]
        assert rows, split
        for row in rows:
            assert row["sample_rate"] == 16_000 and (expresso / row["path"]).exists(), row


@pytest.fixture(scope="module")
def emotion_sft(fixture: CookbookFixture, server: TxServer, expresso: Path) -> RecipeRun:
    return recipe("tinker_cookbook.recipes.audio.emotion.sl_train", {
        "data_dir": expresso, "n_train": 4, "n_eval": 2, "batch_size": 2, "max_steps": 2, "eval_every": 1,
        "save_every": 1, "max_tokens": MAX_TOKENS, "lora_rank": 4}, fixture, server, "emotion-sl")


def test_emotion_sl_train(emotion_sft: RecipeRun, server: TxServer) -> None:
    assert_trained(emotion_sft, 2)
    rows = emotion_sft.metrics()
    for key in ("dev/emotion_accuracy", "dev/emotion_macro_f1", "dev/format_valid"):
        values = emotion_sft.metric_series(key)
        assert values and all(0.0 <= v <= 1.0 for v in values), (key, rows)
    assert_checkpoints_on_server(server, emotion_sft.checkpoints())


def test_emotion_rl_train(fixture: CookbookFixture, server: TxServer, expresso: Path,
                          emotion_sft: RecipeRun) -> None:
    state = emotion_sft.checkpoints()[-1]["state_path"]
    run = recipe("tinker_cookbook.recipes.audio.emotion.rl_train", {
        "data_dir": expresso, "load_checkpoint_path": state, "n_train": 4, "n_eval": 2, "group_size": 2,
        "groups_per_batch": 2, "max_steps": 2, "eval_every": 1, "save_every": 1, "max_tokens": MAX_TOKENS,
        "lora_rank": 4}, fixture, server, "emotion-rl")
    rewards = run.metric_series("env/all/reward/total")
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards), run.metrics()  # 0.5 * style + 0.5 * (1 - WER)+
    assert run.metric_series("dev/format_valid"), run.metrics()
    assert_checkpoints_on_server(server, run.checkpoints())


def test_emotion_evaluate(fixture: CookbookFixture, server: TxServer, expresso: Path,
                          emotion_sft: RecipeRun) -> None:
    sampler = emotion_sft.checkpoints()[-1]["sampler_path"]
    log_path = fixture.new_log_path("emotion-eval")
    run_recipe("tinker_cookbook.recipes.audio.emotion.evaluate", {
        "model_name": MODEL, "model_path": sampler, "data_dir": expresso, "n_eval": 2, "max_tokens": MAX_TOKENS},
        fixture=fixture, server=server, log_path=log_path, timeout_s=600, env=SERVER_ENV)
    record = json.loads((log_path / "metrics.json").read_text())
    assert record["model_path"] == sampler, record
    for key in ("test/emotion_accuracy", "test/emotion_macro_f1", "test/format_valid"):
        assert 0.0 <= record[key] <= 1.0, record
    assert record["test/wer"] >= 0.0, record
    assert list(log_path.glob("eval_rollouts_test_*.jsonl")), "no per-clip rollouts written"


def test_medical_asr_train(fixture: CookbookFixture, server: TxServer) -> None:
    write_ekacare_standin(fixture.dataset_dir(EKACARE_ID))  # 10 clips: 8 train / 2 eval (one batch of 2: test/nll)
    run = recipe("tinker_cookbook.recipes.audio.medical_asr.train", {
        "batch_size": 2, "num_epochs": 1, "max_steps": 2, "eval_every": 1, "save_every": 1,
        "max_tokens": MAX_TOKENS, "lora_rank": 4, "audio_cache_dir": fixture.root / "medical-clips"},
        fixture, server, "medical-asr")
    assert_trained(run, 2)
    assert run.metric_series("test/wer"), run.metrics()
    cer = run.metric_series("test/entity_cer")
    assert cer and all(0.0 <= c <= 1.0 for c in cer), run.metrics()
    assert_finite(run.metric_series("test/nll"), "test/nll")
    assert_checkpoints_on_server(server, run.checkpoints())
