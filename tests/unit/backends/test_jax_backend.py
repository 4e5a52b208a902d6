"""The JAX backend against the torch backend on the same weights and batches, and its own guarantees
(isolated runs, checkpoints either backend reads, one compilation per bucket, startup errors).

Both backends serve the same tiny Qwen3 (and a tiny Llama 3 with rope scaling and tied embeddings); the torch
run's weights are randomised, then carried into the JAX run through `save_state`/`load_state`, so every
comparison also checks the checkpoint format across backends.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from backend_helpers import (
    TINY_NAME,
    ce,
    core_reference,
    datum,
    grads,
    randomize,
    sequences,
    sft_data,
    snapshot,
)

pytest.importorskip("jax")
pytest.importorskip("optax")

from tx.backends import create_backend, losses  # noqa: E402
from tx.backends.jax import shapes, step  # noqa: E402
from tx.backends.jax.backend import JaxBackend  # noqa: E402
from tx.backends.jax.step import JAX_OPS  # noqa: E402
from tx.backends.torch.backend import TorchBackend  # noqa: E402
from tx.backends.torch.ops import TORCH_OPS  # noqa: E402
from tx.config.sections import TrainerSection  # noqa: E402
from tx.inference.manager.selfcheck import check_prompts  # noqa: E402
from tx.models.agreement import FLOAT32_TOLERANCE  # noqa: E402
from tx.optimizers import AdamParams
from tx.types import ForwardBackwardInput, LoraConfig  # noqa: E402

LORA = LoraConfig(rank=4, seed=0)
ADAM = AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.5)
LLAMA = "tiny-llama3"


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory):
    """The tiny Qwen3 of conftest plus a tiny Llama 3 (llama3 rope scaling, tied embeddings) of the same
    LoRA shapes, so both share one compiled AdamW step."""
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, initializer_range=0.1,
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16},
    )
    path = tmp_path_factory.mktemp("tiny-llama3")
    with torch.random.fork_rng():
        torch.manual_seed(99)
        transformers.LlamaForCausalLM(config).save_pretrained(path)
    return {TINY_NAME: tiny_model_dir, LLAMA: path}


@pytest.fixture(scope="module")
def pair(model_dirs):
    """(torch backend, jax backend) serving the same directories."""
    return TorchBackend(model_dirs, device="cpu"), JaxBackend(model_dirs)


_ids = iter(range(10**6))


def twin_runs(pair, base, tmp_path, lora=LORA, seed=1) -> str:
    """A run of the same id on both backends holding the same random LoRA weights (torch -> jax state)."""
    torch_backend, jax_backend = pair
    model_id = f"twin{next(_ids)}"
    torch_backend.create_model(model_id, base, lora)
    randomize(torch_backend, model_id, seed=seed)
    torch_backend.save_state(model_id, tmp_path / model_id)
    jax_backend.create_model(model_id, base, lora)
    jax_backend.load_state(model_id, tmp_path / model_id, with_optimizer=False)
    return model_id


def assert_close_dicts(got, want, atol=1e-4):
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(torch.as_tensor(got[name]), torch.as_tensor(want[name]), rtol=1e-4, atol=atol)


def rl_data(seed: int) -> list:
    rng = np.random.default_rng(seed)
    data = []
    for n in (9, 20, 31):
        seq = sequences(seed, 1, n + 1)[0]
        q = rng.normal(-6.5, 0.5, size=n).astype(np.float32)
        data.append(datum(seq[:-1], target_tokens=seq[1:], logprobs=q, advantages=rng.normal(size=n)))
    return data


@pytest.mark.parametrize(("base", "loss"), [(TINY_NAME, "cross_entropy"), (TINY_NAME, "ppo"),
                                           (TINY_NAME, "importance_sampling"), (LLAMA, "cross_entropy")])
def test_same_weights_same_batch_same_results(pair, tmp_path, base, loss):
    """Logprobs, loss, LoRA gradients and the AdamW step (every AdamParams field set) agree within 1e-4."""
    model_id = twin_runs(pair, base, tmp_path)
    data = sft_data(seed=2, count=3, length=21) if loss == "cross_entropy" else rl_data(seed=3)
    request = ForwardBackwardInput(data, loss, {"clip_low_threshold": 0.1} if loss == "ppo" else {})
    results = [backend.forward_backward(model_id, request) for backend in pair]
    assert results[1].metrics["loss:sum"] == pytest.approx(results[0].metrics["loss:sum"], rel=1e-4, abs=1e-4)
    for want, got in zip(results[0].loss_fn_outputs, results[1].loss_fn_outputs):
        np.testing.assert_allclose(got["logprobs"], want["logprobs"], atol=1e-4)
    assert_close_dicts(pair[1].gradients(model_id), grads(pair[0], model_id))
    norms = [backend.optim_step(model_id, ADAM).metrics["grad_norm"] for backend in pair]
    assert norms[1] == pytest.approx(norms[0], rel=1e-4)
    assert_close_dicts(snapshot(pair[1], model_id), snapshot(pair[0], model_id))


@pytest.mark.parametrize("base", [TINY_NAME, LLAMA])
def test_the_engines_self_check_gets_the_jax_base_forward(pair, tmp_path, model_dirs, base):
    """`base_logprobs` of the JAX trainer is the torch trainer's (no adapter, though a random one is loaded),
    and the core hands it to the engines' self-check (before: None, and the engine was left unchecked)."""
    twin_runs(pair, base, tmp_path)
    sequences_ = check_prompts(model_dirs[base]) + [[3, 9, 27, 81, 12]]
    want = pair[0].base_logprobs(base, sequences_)
    got = core_reference(pair[1], base, sequences_)
    assert got is not None and got.tolerance == FLOAT32_TOLERANCE
    assert [len(row) for row in got.logprobs] == [len(row) for row in want.logprobs]
    np.testing.assert_allclose(np.concatenate(got.logprobs), np.concatenate(want.logprobs), atol=1e-5)


def test_runs_are_isolated_seeded_and_target_their_modules(pair):
    jax_backend = pair[1]
    jax_backend.create_model("iso-a", TINY_NAME, LORA)
    jax_backend.create_model("iso-b", TINY_NAME, LORA)
    jax_backend.create_model("iso-c", TINY_NAME, LoraConfig(rank=4, seed=1))
    a, b, c = (snapshot(jax_backend, m) for m in ("iso-a", "iso-b", "iso-c"))
    assert_close_dicts(a, b, atol=0)
    assert any(not torch.equal(a[n], c[n]) for n in a if "lora_A" in n)
    for _ in range(2):
        jax_backend.forward_backward("iso-a", ce(sft_data(seed=0, count=3, length=21)))
        jax_backend.optim_step("iso-a", AdamParams(learning_rate=1e-2))
    assert any(not torch.equal(a[n], w) for n, w in snapshot(jax_backend, "iso-a").items())
    assert_close_dicts(snapshot(jax_backend, "iso-b"), b, atol=0)
    assert all(torch.count_nonzero(g) == 0 for g in jax_backend.gradients("iso-b").values())
    jax_backend.create_model("unembed-only", TINY_NAME, LoraConfig(rank=4, train_attn=False, train_mlp=False))
    assert sorted(snapshot(jax_backend, "unembed-only")) == [
        "base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"]
    for model_id in ("iso-a", "iso-b", "iso-c", "unembed-only"):
        jax_backend.delete_model(model_id)


def test_optimizer_state_crosses_backends_both_ways(pair, tmp_path):
    """torch trains, jax resumes with the optimizer (and back): the next steps equal the other's."""
    torch_backend, jax_backend = pair
    data = sft_data(seed=5, count=3, length=21)
    model_id = twin_runs(pair, TINY_NAME, tmp_path)
    for _ in range(2):
        torch_backend.forward_backward(model_id, ce(data))
        torch_backend.optim_step(model_id, ADAM)
    for source, target in (pair, pair[::-1]):
        path = tmp_path / f"from-{type(source).__name__}"
        source.save_state(model_id, path)
        target.load_state(model_id, path, with_optimizer=True)
        for backend in pair:
            backend.forward_backward(model_id, ce(data))
            backend.optim_step(model_id, ADAM)
        assert_close_dicts(snapshot(jax_backend, model_id), snapshot(torch_backend, model_id))


def test_sampler_weights_load_as_a_peft_adapter(pair, tmp_path, model_dirs):
    from peft import PeftModel

    model_id = twin_runs(pair, TINY_NAME, tmp_path, seed=7)
    pair[1].save_sampler_weights(model_id, tmp_path / "sampler")
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dirs[TINY_NAME], dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "sampler")
    data = sft_data(seed=6, count=1, length=30)
    want = pair[1].forward_backward(model_id, ce(data, forward_only=True)).loss_fn_outputs[0]["logprobs"]
    with torch.no_grad():
        logits = peft_model(input_ids=torch.tensor([data[0].model_input.text_tokens()])).logits[0]
    targets = torch.from_numpy(data[0].loss_fn_inputs["target_tokens"])
    got = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_random_lengths_compile_once_per_bucket(pair):
    """100 steps of 4 datums of random lengths (2-30 tokens: buckets 16 and 32) compile at most 2 passes."""
    jax_backend = pair[1]
    jax_backend.create_model("buckets", TINY_NAME, LORA)
    before = step.forward_backward._cache_size()
    rng = np.random.default_rng(0)
    for _ in range(100):
        data = [sft_data(seed=int(rng.integers(1 << 30)), count=1, length=int(n))[0]
                for n in rng.integers(3, 32, size=4)]
        jax_backend.forward_backward("buckets", ce(data))
        jax_backend.optim_step("buckets", AdamParams(learning_rate=1e-3))
    assert step.forward_backward._cache_size() - before <= 2
    jax_backend.delete_model("buckets")


def test_micro_batches_follow_the_token_budget():
    lengths = [5, 70, 33, 33, 12, 300]
    batches = shapes.plan(lengths, token_budget=128, max_length=256, devices=2)
    assert sorted(i for indices, _, _ in batches for i in indices) == list(range(6))
    for indices, length, rows in batches:
        assert rows % 2 == 0 and length in (16, 32, 64, 128, 256) or length == 300
        assert len(indices) == 1 or rows * length <= 128
        assert all(lengths[i] <= length for i in indices)
    assert ([5], 256, 2) not in batches and any(indices == [5] for indices, _, _ in batches)  # 300 runs alone
    assert shapes.length_bucket(17, 2048) == 32 and shapes.length_bucket(3000, 2048) == 3000


def test_vision_language_model_is_a_startup_error(tmp_path):
    transformers.Qwen2VLConfig(architectures=["Qwen2VLForConditionalGeneration"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vision-language model under --backend jax.*--backend torch"):
        create_backend({"vlm": tmp_path}, TrainerSection(backend="jax"))


def test_missing_extra_names_the_pip_extra(monkeypatch, tiny_model_dir):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optax" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'tx\[jax\]'"):
        create_backend({TINY_NAME: tiny_model_dir}, TrainerSection(backend="jax"))


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_every_loss_formula_runs_on_both_array_libraries(name):
    """One definition per loss: torch and JAX arrays give the same terms and the same d(sum)/d(logp)."""
    import jax
    import jax.numpy as jnp

    loss = losses.get_loss(name)
    rng = np.random.default_rng(0)
    shape = (2, 6, 1)
    logp = rng.normal(-2.0, 0.5, size=shape).astype(np.float32)
    inputs = {key: rng.normal(-2.0, 0.5, size=shape).astype(np.float32) for key in loss.float_inputs}
    if loss.needs_provenance:
        inputs[losses.SAMPLED_KEY] = (rng.random(shape) > 0.3).astype(np.float32)
    config = loss.resolve_config({})
    torch_logp = torch.tensor(logp, requires_grad=True)
    torch_terms = loss.compute(TORCH_OPS, torch_logp, {k: torch.tensor(v) for k, v in inputs.items()}, config)
    torch_terms.sum().backward()

    def total(x):
        terms = loss.compute(JAX_OPS, x, {k: jnp.asarray(v) for k, v in inputs.items()}, config)
        return terms.sum(), terms

    (_, jax_terms), jax_grad = jax.value_and_grad(total, has_aux=True)(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(jax_terms), torch_terms.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax_grad), torch_logp.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_torch_only_settings_are_refused_not_ignored(tiny_model_dir):
    with pytest.raises(ValueError, match="--train-dtype other than float32"):
        create_backend({TINY_NAME: tiny_model_dir}, TrainerSection(backend="jax", dtype="bfloat16"))
    with pytest.raises(ValueError, match="--trainer-workers"):
        create_backend({TINY_NAME: tiny_model_dir}, TrainerSection(backend="jax", workers=2))
    backend = create_backend({TINY_NAME: tiny_model_dir}, TrainerSection(backend="jax", micro_batch_tokens=64))
    assert backend.micro_batch_tokens == 64
