"""tinker-cookbook's vlm_classifier recipe, unchanged, against tx, offline (docs/cookbook.md#recipes-tx-runs).

`python -m tinker_cookbook.recipes.vlm_classifier.train dataset=caltech101` fine-tunes a LoRA image
classifier for two steps on the tiny Qwen3-VL filed as `Qwen/Qwen3-VL-30B-A3B-Instruct` (the cookbook maps
that name to the qwen3_vl_instruct renderer; the tokenizer and the image processor come from the same name
in the fixture's HF cache). The dataset is a tiny stand-in for `dpdl-benchmark/caltech101`: a local folder of
train/test parquet files with an `Image()` column of small synthetic images and a `ClassLabel` label column.

Each step sends ImageChunks (JPEG bytes + the cookbook's `expected_tokens`, which the server checks
against its own count) in forward_backward. At every eval step (eval_every=1: steps 0 and 1, i.e. the
initial weights and the weights after one optimizer step) the recipe snapshots a sampler
(save_weights_and_get_sampling_client), then runs the ClassifierEvaluator (greedy `sample` from an image
prompt pre-filled with "The subject in this photo is:", metric `accuracy`) and the SamplerNLLEvaluator
(`compute_logprobs` over every test example, image positions included, metrics `test/nll` and `test/bpb`).
Checks: exit 0; finite train NLL; image tokens counted in the trained lengths; finite test NLL at both eval
steps, lower after the step (the sampler snapshot has the trained LoRA); an accuracy in [0, 1]; no
expected_tokens error in the recipe output or the server log; the checkpoints it recorded exist on the server.

The random tiny model classifies at chance (in practice 0: it does not even produce a class name), so only
the presence and range of `accuracy` is checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from cookbook import (
    CookbookFixture,
    assert_checkpoints_on_server,
    assert_finite,
    recipe_test_marks,
    run_recipe,
    start_tx_server,
)
from txserver import TxServer

pytestmark = recipe_test_marks()

VLM_MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct"  # model_info: -> qwen3_vl_instruct
RENDERER = "qwen3_vl_instruct"
DATASET_ID = "dpdl-benchmark/caltech101"
# Real caltech101 names; the recipe turns "Faces_easy" into "faces easy" (get_class_name).
CLASS_NAMES = ["accordion", "airplanes", "Faces_easy"]
TRAIN_PER_CLASS = 3
TEST_PER_CLASS = 1  # the NLL evaluator scores the WHOLE test split (no few-shot sampling there)
EXAMPLES_PER_CLASS = 2  # few-shot subset of train: 6 examples
BATCH_SIZE = 2  # 3 batches per epoch
MAX_STEPS = 2
N_EVAL = 2
MAX_TOKENS = 8
# Sizes with different image-token counts (smart_resize up to >= 65536 px in 32-px multiples, then /16/16/4):
# 64x48 -> 70, 32x32 -> 64, 48x64 -> 70, 40x24 -> 77. Each is the cookbook's expected_tokens, which the
# server checks against its own count (a mismatch is a 400 naming expected_tokens).
SIZES = [(64, 48), (32, 32), (48, 64), (40, 24)]
MIN_IMAGE_TOKENS = 64
# tiny Qwen3-VL forward/backward on 2 busy cores: torch threads only slow it down
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def write_caltech101_standin(dataset_dir: Path) -> dict[str, int]:
    """`data/{train,test}-00000-of-00001.parquet` with `image` (Image()) and `label` (ClassLabel) columns.

    `datasets.load_dataset("dpdl-benchmark/caltech101")` takes the local-directory branch when this folder is
    at that relative path in the cwd (docs/cookbook.md#datasets-offline); the parquet keeps both features. Returns rows per split.
    """
    import datasets
    import numpy as np
    from PIL import Image

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASS_NAMES)})
    rng = np.random.default_rng(0)
    counts = {}
    for split, per_class in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        images, labels = [], []
        for label in range(len(CLASS_NAMES)):
            for i in range(per_class):
                w, h = SIZES[(label + i) % len(SIZES)]
                base = np.array([(80 * label) % 256, 255 - 60 * label, 40 + 50 * i], dtype=np.int16)
                noise = rng.integers(-30, 30, size=(h, w, 3))
                pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
                images.append(Image.fromarray(pixels, "RGB"))
                labels.append(label)
        ds = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
        out = dataset_dir / "data" / f"{split}-00000-of-00001.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(out))
        counts[split] = len(ds)
    return counts


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> CookbookFixture:
    return CookbookFixture.create(tmp_path_factory.mktemp("cookbook"), models=[VLM_MODEL], preset="vlm")


@pytest.fixture(scope="module")
def cookbook_server(fixture: CookbookFixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with start_tx_server(fixture, tmp_path_factory.mktemp("tx-data"), env=SERVER_ENV) as srv:
        yield srv


def test_vlm_classifier_trains_evaluates_and_checkpoints(fixture: CookbookFixture,
                                                         cookbook_server: TxServer) -> None:
    counts = write_caltech101_standin(fixture.dataset_dir(DATASET_ID))
    experiment_dir = fixture.new_log_path("vlm_classifier")
    run = run_recipe(
        "tinker_cookbook.recipes.vlm_classifier.train",
        {
            "experiment_dir": experiment_dir,  # the run dir is <experiment_dir>/<dataset>-<model>-...-<date>
            "dataset": "caltech101",
            "model_name": VLM_MODEL,
            "renderer_name": RENDERER,
            "lora_rank": 8,
            "learning_rate": 1e-2,
            "lr_schedule": "constant",
            "num_epochs": 1,
            "batch_size": BATCH_SIZE,
            "max_length": 512,
            "examples_per_class": EXAMPLES_PER_CLASS,
            "max_steps": MAX_STEPS,
            "save_every": 1,
            "eval_every": 1,  # steps 0 and 1: initial weights, then after one optimizer step
            "infrequent_eval_every": 0,
            "n_eval": N_EVAL,
            "max_tokens": MAX_TOKENS,
        },
        fixture=fixture,
        server=cookbook_server,
        timeout_s=300,
        env=SERVER_ENV,
    )
    run_dirs = [p for p in experiment_dir.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1, f"expected one run dir under {experiment_dir}: {run_dirs}"
    run = dataclasses.replace(run, log_path=run_dirs[0])

    server_log = cookbook_server.log()
    for text, where in ((run.output(), "recipe output"), (server_log, "server log")):
        assert "expected_tokens" not in text, (
            f"{where} mentions expected_tokens (a count mismatch?):\n{text[-4000:]}"
        )

    rows = sorted(run.metrics(), key=lambda r: r.get("step", 0))
    assert [r["step"] for r in rows] == list(range(MAX_STEPS)), rows
    nll = run.metric_series("train_mean_nll")
    assert len(nll) == MAX_STEPS, rows
    assert_finite(nll, "train_mean_nll")
    for r in rows:  # one image per example: its tokens are counted in the trained sequence lengths
        assert r["num_tokens"] >= r["num_sequences"] * MIN_IMAGE_TOKENS, r

    test_nll = run.metric_series("test/nll")
    assert len(test_nll) == MAX_STEPS, f"test/nll at every eval step: {rows}"  # eval_every=1
    assert_finite(test_nll, "test/nll")
    assert all(x > 0 for x in test_nll), test_nll
    # step 1's sampler snapshot holds the weights after one optimizer step (lr 1e-2, shared answer prefix)
    assert test_nll[1] < test_nll[0], f"test/nll did not fall after a step: {test_nll}"
    assert_finite(run.metric_series("test/bpb"), "test/bpb")

    accuracy = run.metric_series("accuracy")
    assert len(accuracy) == MAX_STEPS, f"accuracy at every eval step: {rows}"
    assert all(0.0 <= a <= 1.0 for a in accuracy), accuracy

    ckpts = run.checkpoints()
    names = [c["name"] for c in ckpts]
    assert "final" in names, ckpts
    for c in ckpts:
        assert c.get("state_path") and c.get("sampler_path"), c  # periodic and final saves are "both"
    checked = assert_checkpoints_on_server(cookbook_server, ckpts)
    print(f"vlm_classifier: {MAX_STEPS} steps in {run.elapsed_s:.1f}s on {counts}; train_mean_nll {nll}; "
          f"test/nll {test_nll}; accuracy {accuracy}; checkpoints {names} ({len(checked)} on the server)")
