"""tinker-cookbook's math_rl recipe, unchanged, against tx, offline (docs/cookbook.md#recipes-tx-runs).

`python -m tinker_cookbook.recipes.math_rl.train env=arithmetic loss_fn=importance_sampling` runs two RL
steps on the tiny model filed as `Qwen/Qwen3-8B`. The arithmetic env needs no dataset (random x+y problems
behind a fixed few-shot prefix). Each step: sample every env of every group from the current sampling client
(stop = the renderer's stop: a token id for qwen3, a string for role_colon), forward_backward
(importance_sampling), optim_step, then a new sampling client (save_every=1: save_state +
save_weights_for_sampler + create_sampling_client(model_path=...)).
Checks: exit 0; one metrics row per step; finite loss metrics; `optim/kl_sample_train_v1` ~0 at the first
step (and at every step, the loop being on-policy), i.e. the sampler's logprobs of the sampled tokens match
the trainer's for the same weights; the checkpoints it recorded exist on the server. It runs against the
embedded engine and, where vLLM is installed, against `tx serve --engine vllm`.

With a random tiny model every group's reward is constant (no sample is well formed), so the advantages and
the gradient are zero (grad_norm 0) and the weights do not move: the recipe still runs its full loop, but the
kl check compares sampler and trainer on the initial (zero-delta LoRA) weights only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cookbook import (
    DEFAULT_MODEL,
    CookbookFixture,
    assert_checkpoints_on_server,
    assert_finite,
    recipe_test_marks,
    run_recipe,
    start_tx_server,
)
from live_engine import vllm_missing
from txserver import TxServer

pytestmark = recipe_test_marks()

MAX_STEPS = 2
GROUP_SIZE = 2
GROUPS_PER_BATCH = 4
MAX_TOKENS = 8
SAVE_EVERY = 1  # every step ends in a periodic save; step 1 samples from create_sampling_client(sampler_path)
KL_TOL = 1e-2


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> CookbookFixture:
    return CookbookFixture.create(tmp_path_factory.mktemp("cookbook"), models=[DEFAULT_MODEL])


ENGINES = ["embedded", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])]


@pytest.fixture(scope="module", params=ENGINES)
def cookbook_server(request: pytest.FixtureRequest, fixture: CookbookFixture,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """The recipe against each engine: the embedded one, and vLLM (`--engine vllm`) where it is installed."""
    reason = vllm_missing() if request.param == "vllm" else None
    if reason is not None:
        pytest.skip(reason)
    with start_tx_server(fixture, tmp_path_factory.mktemp("tx-data"), args=["--engine", request.param]) as srv:
        yield srv


# qwen3 stops on the `<|im_end|>` token id (stop=[int]); role_colon on the string "\n\nUser:" (stop=[str]).
@pytest.mark.parametrize("renderer", ["qwen3", "role_colon"])
def test_math_rl_arithmetic_importance_sampling(fixture: CookbookFixture, cookbook_server: TxServer,
                                                renderer: str) -> None:
    log_path = fixture.new_log_path(f"math_rl-{renderer}")
    run = run_recipe(
        "tinker_cookbook.recipes.math_rl.train",
        {
            "model_name": DEFAULT_MODEL,
            "renderer_name": renderer,
            "env": "arithmetic",
            "loss_fn": "importance_sampling",
            "group_size": GROUP_SIZE,
            "groups_per_batch": GROUPS_PER_BATCH,
            "max_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "lora_rank": 8,
            "learning_rate": 1e-4,
            "max_steps": MAX_STEPS,
            "save_every": SAVE_EVERY,
            "eval_every": 0,
        },
        fixture=fixture,
        server=cookbook_server,
        log_path=log_path,
        timeout_s=300,
    )

    # One row per training step, then (at step=MAX_STEPS) a row of cumulative token totals only.
    rows = sorted(run.metrics(), key=lambda r: r.get("step", 0))
    steps = [r for r in rows if "progress/batch" in r]
    assert [r["step"] for r in steps] == list(range(MAX_STEPS)), rows
    assert all(r["step"] == MAX_STEPS and "progress/batch" not in r for r in rows[MAX_STEPS:]), rows

    # Per-step numbers: sampled tokens were trained (a non-empty action mask is what makes the recipe compute
    # optim/kl_sample_train_*), and every number it logged is finite. The RL loop logs no forward_backward
    # loss; its loss-side numbers are grad_norm (optim_step) and the optim/* sample-vs-train comparison.
    for r in steps:
        assert r["env/all/total_ac_tokens"] > 0 and r["tokens/trained"] > 0, r
        for key in ("optim/kl_sample_train_v1", "optim/kl_sample_train_v2", "optim/entropy", "grad_norm",
                    "env/all/reward/total"):
            assert key in r, f"step {r['step']}: {key} missing: {sorted(r)}"
        assert_finite([v for v in r.values() if isinstance(v, (int, float))], f"step {r['step']} metrics")

    # The sampler's logprobs of the sampled tokens are the trainer's logprobs for the same weights. Sync RL is
    # on-policy, so this holds at every step: step 0 samples from save_weights_and_get_sampling_client, step 1
    # from the sampler checkpoint the step-0 save wrote.
    kl = run.metric_series("optim/kl_sample_train_v1")
    kl2 = run.metric_series("optim/kl_sample_train_v2")
    assert abs(kl[0]) < KL_TOL and kl2[0] < KL_TOL, f"sampler vs trainer at step 0: v1 {kl}, v2 {kl2}"
    assert all(abs(x) < KL_TOL for x in kl) and all(x < KL_TOL for x in kl2), f"v1 {kl}, v2 {kl2}"

    ckpts = run.checkpoints()
    names = [c["name"] for c in ckpts]
    assert "final" in names and len(names) > 1, ckpts  # periodic saves (save_every=1) and the final one
    for c in ckpts:
        assert c.get("state_path") and c.get("sampler_path"), c  # periodic and final saves are "both"
    checked = assert_checkpoints_on_server(cookbook_server, ckpts)
    print(f"math_rl[{renderer}]: {MAX_STEPS} steps in {run.elapsed_s:.1f}s; kl_sample_train {kl} / {kl2}; "
          f"grad_norm {run.metric_series('grad_norm')}; checkpoints {names} ({len(checked)} on the server)")
