"""tinker-cookbook's RL recipes, unchanged and with their default loss (`stable_reinforce`), against tx, offline
(docs/cookbook.md#recipes-tx-runs): only sizes, the model (the tiny model filed as `Qwen/Qwen3-8B`) and local datasets
differ from what they ship with.

- `math_rl` sync, `env=arithmetic` (random x+y problems behind a fixed few-shot prefix, no dataset): each step
  samples every env of every group from a `record_stability_info` client (stop = the renderer's stop: a token id
  for qwen3, a string for role_colon), trains `stable_reinforce` on datums whose provenance names the recorded
  sequences, then gets a new sampling client (save_every=1: save_state + save_weights_for_sampler +
  create_sampling_client(model_path=..., record_stability_info=True)). On the embedded engine and on vLLM.
- `math_rl` async (`max_steps_off_policy=1`): sampling runs a step ahead of training (`AsyncConfig`, whose loss
  is `stable_reinforce` too).
- `rl_loop` on a local `openai/gsm8k` stand-in: `save_weights_and_get_sampling_client(record_stability_info=True)`
  each batch, `num_samples=group_size` per question, the final save.
- The reward rises: `math_rl` started (`load_checkpoint_path`) from the tiny model briefly fine-tuned on the
  few-shot format, so that some answers end with the stop token; a few RL steps make most of them do.

With a random tiny model every group's reward is constant (no sample is well formed), so advantages are zero and
the weights do not move; those runs still send every datum, with provenance, through the records' checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cookbook import (
    DEFAULT_MODEL,
    CookbookFixture,
    RecipeRun,
    assert_checkpoints_on_server,
    assert_finite,
    recipe_test_marks,
    run_recipe,
    start_tx_server,
)
from live_engine import vllm_missing
from txserver import TxServer

pytestmark = recipe_test_marks()

MATH_RL = "tinker_cookbook.recipes.math_rl.train"
MAX_STEPS = 2
KL_TOL = 1e-2
SIZES = {"group_size": 2, "groups_per_batch": 4, "max_tokens": 8, "lora_rank": 8, "learning_rate": 1e-4,
         "eval_every": 0}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> CookbookFixture:
    fx = CookbookFixture.create(tmp_path_factory.mktemp("cookbook"), models=[DEFAULT_MODEL])
    write_gsm8k_standin(fx.dataset_dir("openai/gsm8k"))
    return fx


ENGINES = ["embedded", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])]


@pytest.fixture(scope="module", params=ENGINES)
def cookbook_server(request: pytest.FixtureRequest, fixture: CookbookFixture,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """The recipes against each engine: the embedded one, and vLLM (`--engine vllm`) where it is installed."""
    reason = vllm_missing() if request.param == "vllm" else None
    if reason is not None:
        pytest.skip(reason)
    with start_tx_server(fixture, tmp_path_factory.mktemp("tx-data"), args=["--engine", request.param]) as srv:
        yield srv


@pytest.fixture
def embedded_server(cookbook_server: TxServer) -> TxServer:
    """The module's server, for the recipes run on the embedded engine only (each run costs a minute or more)."""
    if "vllm" in cookbook_server.args:
        pytest.skip("run on the embedded engine only")
    return cookbook_server


def write_gsm8k_standin(dataset_dir: Path, rows: int = 8) -> None:
    """`openai/gsm8k` config `main` as local parquet (question, answer ending in `#### N`); the README's
    `configs:` block maps the config to its files (docs/cookbook.md#datasets-offline)."""
    import datasets

    data = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many apples does he have now?",
             "answer": f"He has {i} + {i + 2} = {2 * i + 2} apples.\n#### {2 * i + 2}"} for i in range(rows)]
    for split in ("train", "test"):
        out = dataset_dir / "main" / f"{split}-00000-of-00001.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_list(data).to_parquet(str(out))
    (dataset_dir / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n---\n")


def steps_of(run: RecipeRun, max_steps: int) -> list[dict]:
    """One metrics row per training step, checked: then (at step=max_steps) a row of cumulative totals only."""
    rows = sorted(run.metrics(), key=lambda r: r.get("step", 0))
    steps = [r for r in rows if "env/all/reward/total" in r]
    assert [r["step"] for r in steps] == list(range(max_steps)), rows
    for r in steps:
        assert r["env/all/total_ac_tokens"] > 0 and r["tokens/trained"] > 0, r
        for key in ("optim/kl_sample_train_v1", "optim/kl_sample_train_v2", "optim/entropy", "grad_norm"):
            assert key in r, f"step {r['step']}: {key} missing: {sorted(r)}"
        assert_finite([v for v in r.values() if isinstance(v, (int, float))], f"step {r['step']} metrics")
    return steps


# qwen3 stops on the `<|im_end|>` token id (stop=[int]); role_colon on the string "\n\nUser:" (stop=[str]).
@pytest.mark.parametrize("renderer", ["qwen3", "role_colon"])
def test_math_rl_arithmetic(fixture: CookbookFixture, cookbook_server: TxServer, renderer: str) -> None:
    log_path = fixture.new_log_path(f"math_rl-{renderer}")
    run = run_recipe(MATH_RL, {"model_name": DEFAULT_MODEL, "renderer_name": renderer, "env": "arithmetic",
                               **SIZES, "max_steps": MAX_STEPS, "save_every": 1},
                     fixture=fixture, server=cookbook_server, log_path=log_path, timeout_s=300)
    steps_of(run, MAX_STEPS)
    # The sampler's logprobs of the sampled tokens are the trainer's for the same weights. Sync RL is on-policy:
    # step 0 samples from save_weights_and_get_sampling_client, step 1 from the sampler checkpoint of step 0.
    kl, kl2 = run.metric_series("optim/kl_sample_train_v1"), run.metric_series("optim/kl_sample_train_v2")
    assert all(abs(x) < KL_TOL for x in kl) and all(x < KL_TOL for x in kl2), f"v1 {kl}, v2 {kl2}"

    ckpts = run.checkpoints()
    names = [c["name"] for c in ckpts]
    assert "final" in names and len(names) > 1, ckpts  # periodic saves (save_every=1) and the final one
    for c in ckpts:
        assert c.get("state_path") and c.get("sampler_path"), c  # periodic and final saves are "both"
    checked = assert_checkpoints_on_server(cookbook_server, ckpts)
    print(f"math_rl[{renderer}]: {MAX_STEPS} steps in {run.elapsed_s:.1f}s; kl_sample_train {kl} / {kl2}; "
          f"checkpoints {names} ({len(checked)} on the server)")


def test_math_rl_async(fixture: CookbookFixture, embedded_server: TxServer) -> None:
    """`max_steps_off_policy=1`: rollouts for the next step are sampled while this one trains."""
    run = run_recipe(MATH_RL, {"model_name": DEFAULT_MODEL, "renderer_name": "qwen3", "env": "arithmetic",
                               **SIZES, "max_steps": MAX_STEPS, "save_every": 0, "max_steps_off_policy": 1},
                     fixture=fixture, server=embedded_server, log_path=fixture.new_log_path("math_rl-async"),
                     timeout_s=300)
    steps_of(run, MAX_STEPS)
    assert "final" in [c["name"] for c in run.checkpoints()]
    print(f"math_rl async: {MAX_STEPS} steps in {run.elapsed_s:.1f}s")


def test_rl_loop(fixture: CookbookFixture, embedded_server: TxServer) -> None:
    """rl_loop on the gsm8k stand-in: a random model never writes a `\\boxed{}` answer, so every group is
    skipped (all advantages zero) and no step trains; sampling with stability info and the saves run."""
    run = run_recipe("tinker_cookbook.recipes.rl_loop",
                     {"model_name": DEFAULT_MODEL, "batch_size": 2, "group_size": 2, "max_tokens": 8,
                      "lora_rank": 8, "max_steps": 2, "save_every": 1},
                     fixture=fixture, server=embedded_server, log_path=fixture.new_log_path("rl_loop"),
                     timeout_s=300)
    rows = run.metrics()
    assert [r["step"] for r in rows] == [0, 1] and all(r["reward/total"] == 0.0 for r in rows), rows
    ckpts = run.checkpoints()
    assert [c["name"] for c in ckpts] == ["000001", "final"] and ckpts[-1].get("sampler_path"), ckpts
    assert_checkpoints_on_server(embedded_server, ckpts)


def test_math_rl_reward_rises(fixture: CookbookFixture, embedded_server: TxServer) -> None:
    """A few steps of math_rl, default loss, from the tiny model fine-tuned 8 steps on the few-shot format (its
    answers end with `<|im_end|>` about a fifth of the time): the format reward, and so the reward, rises."""
    warm = warm_start(embedded_server, fixture.add_model(DEFAULT_MODEL))
    steps = 4
    run = run_recipe(MATH_RL, {"model_name": DEFAULT_MODEL, "renderer_name": "qwen3", "env": "arithmetic",
                               "group_size": 4, "groups_per_batch": 8, "max_tokens": 5, "learning_rate": 2e-3,
                               "eval_every": 0, "save_every": 0, "max_steps": steps, "load_checkpoint_path": warm},
                     fixture=fixture, server=embedded_server, log_path=fixture.new_log_path("math_rl-rise"),
                     timeout_s=600)
    steps_of(run, steps)
    reward, well_formed = run.metric_series("env/all/reward/total"), run.metric_series("env/all/format")
    kl = run.metric_series("optim/kl_sample_train_v1")
    print(f"math_rl reward {reward}, format {well_formed}, kl_sample_train {kl} in {run.elapsed_s:.1f}s")
    assert well_formed[-1] >= well_formed[0] + 0.3 and reward[-1] > reward[0] + 0.03, (reward, well_formed)
    assert abs(kl[0]) < KL_TOL, kl  # trained weights: the sampler's logprobs are still the trainer's


def warm_start(server: TxServer, model_dir: Path) -> str:
    """The state path of a LoRA (rank 8) fine-tuned 8 steps on arithmetic answers in the qwen3 format (the
    tokenizer read from the model's snapshot directory: this process's HF cache is not the fixture's)."""
    from tinker import types
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.supervised.common import datum_from_model_input_weights
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer("qwen3", get_tokenizer(str(model_dir)))
    rng = np.random.default_rng(0)

    def example() -> types.Datum:
        x, y = (int(v) for v in rng.integers(0, 101, 2))
        messages = [*ArithmeticEnv.standard_fewshot_prefix(), {"role": "user", "content": f"What is {x} + {y}?"},
                    {"role": "assistant", "content": str(x + y)}]
        return datum_from_model_input_weights(*renderer.build_supervised_example(messages))

    with server.client() as client:
        tc = client.create_lora_training_client(DEFAULT_MODEL, rank=8, seed=0).result()
        for _ in range(8):
            tc.forward_backward([example() for _ in range(16)], "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=4e-3)).result()
        return tc.save_state("warm-start").result().path
