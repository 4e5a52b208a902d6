"""The official tinker SDK against a real tx server: training, ordering, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
import torch
from tinker import types


BASE = "tiny-qwen3"


TRAINER_SERVERS = {"in-process": "server", "2-workers": "workers_server", "jax": "jax_server"}
AND_JAX = pytest.mark.parametrize("trainer_client", ["in-process", "2-workers", "jax"], indirect=True)


@pytest.fixture(params=["in-process", "2-workers"])
def trainer_client(request: pytest.FixtureRequest):
    """A ServiceClient on the in-process trainer, then on one whose trainer runs on 2 workers (and on the jax
    backend for tests marked AND_JAX)."""
    server = request.getfixturevalue(TRAINER_SERVERS[request.param])
    with server.client() as client:
        yield client


def sequences(n: int = 4, length: int = 33, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(10, 1990, size=length).tolist() for _ in range(n)]


def datum(tokens: list[int], weight: float = 1.0) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [weight] * (len(tokens) - 1)},
    )


def total_tokens(data: list[types.Datum]) -> int:
    return sum(d.model_input.length for d in data)


def step(tc: tinker.TrainingClient, data: list[types.Datum], lr: float = 5e-3) -> float:
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=lr))
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    return loss


@AND_JAX
def test_sft_memorises_sequences(trainer_client: tinker.ServiceClient) -> None:
    tc = trainer_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    data = [datum(s) for s in sequences()]
    n = total_tokens(data)
    losses = [step(tc, data) / n for _ in range(30)]
    assert np.isfinite(losses).all()
    assert min(losses) <= 0.5 * losses[0], losses


def test_forward_outputs_match_cross_entropy_loss(trainer_client: tinker.ServiceClient) -> None:
    tc = trainer_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    data = [datum(s) for s in sequences(3, length=20, seed=1)]
    out = tc.forward(data, "cross_entropy").result()
    logprobs = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
    assert [len(lp) for lp in logprobs] == [19, 19, 19]
    assert out.metrics["loss:sum"] == pytest.approx(-sum(lp.sum() for lp in logprobs), rel=1e-4)
    assert all((lp < 0).all() for lp in logprobs)


def test_zero_weights_give_zero_loss_and_no_update(service_client: tinker.ServiceClient) -> None:
    tc = service_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    data = [datum(s, weight=0.0) for s in sequences(2, seed=2)]
    before = tc.forward(data, "cross_entropy").result()
    fb = tc.forward_backward(data, "cross_entropy").result()
    assert fb.metrics["loss:sum"] == 0.0
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = tc.forward(data, "cross_entropy").result()
    for a, b in zip(before.loss_fn_outputs, after.loss_fn_outputs):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())


def test_custom_loss_gives_cross_entropy_gradients(trainer_client: tinker.ServiceClient) -> None:
    """Same seed, same data: a custom loss equal to cross_entropy must move the weights identically."""
    data = [datum(s, weight=0.5) for s in sequences(2, length=17, seed=3)]
    ce = trainer_client.create_lora_training_client(BASE, rank=4, seed=7).result()
    custom = trainer_client.create_lora_training_client(BASE, rank=4, seed=7).result()

    def nll(batch: list[types.Datum], logprobs: list[torch.Tensor]):
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].data)).sum() for d, lp in zip(batch, logprobs))
        return loss, {"nll": float(loss)}

    ce_out = ce.forward_backward(data, "cross_entropy").result()
    custom_out = custom.forward_backward_custom(data, nll).result()
    assert custom_out.metrics["loss:sum"] == pytest.approx(ce_out.metrics["loss:sum"], rel=1e-5)
    adam = types.AdamParams(learning_rate=1e-2)
    ce.optim_step(adam).result()
    custom.optim_step(adam).result()
    probe = [datum(s) for s in sequences(2, length=17, seed=4)]
    a = ce.forward(probe, "cross_entropy").result().loss_fn_outputs
    b = custom.forward(probe, "cross_entropy").result().loss_fn_outputs
    for x, y in zip(a, b):
        np.testing.assert_allclose(x["logprobs"].to_numpy(), y["logprobs"].to_numpy(), atol=1e-5)


def test_pipelined_submissions_keep_their_order(service_client: tinker.ServiceClient) -> None:
    batches = [[datum(s)] for s in sequences(5, seed=5)]
    piped = service_client.create_lora_training_client(BASE, rank=8, seed=1).result()
    serial = service_client.create_lora_training_client(BASE, rank=8, seed=1).result()
    futures = []
    for batch in batches:  # submit everything before waiting on anything
        futures.append(piped.forward_backward(batch, "cross_entropy"))
        futures.append(piped.optim_step(types.AdamParams(learning_rate=1e-2)))
    piped_losses = [f.result().metrics["loss:sum"] for f in futures[::2]]
    [f.result() for f in futures[1::2]]
    serial_losses = [step(serial, batch, lr=1e-2) for batch in batches]
    np.testing.assert_allclose(piped_losses, serial_losses, rtol=1e-5)


@AND_JAX
def test_save_then_load_with_optimizer_reproduces_next_step(trainer_client: tinker.ServiceClient) -> None:
    data = [datum(s) for s in sequences(2, seed=6)]
    tc = trainer_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    for _ in range(3):
        step(tc, data)
    path = tc.save_state("resume-me").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/resume-me")
    step(tc, data)
    expected = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]

    resumed = trainer_client.create_training_client_from_state_with_optimizer(path).result()
    step(resumed, data)
    got = resumed.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert got == pytest.approx(expected, rel=1e-5)

    without_opt = trainer_client.create_training_client_from_state(path).result()
    step(without_opt, data)
    fresh_adam = without_opt.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert fresh_adam != pytest.approx(expected, rel=1e-5)


@AND_JAX
def test_chunked_forward_backward_accumulates(trainer_client: tinker.ServiceClient) -> None:
    """Two forward_backward calls then one optim_step equal one call with all the data."""
    data = [datum(s) for s in sequences(4, seed=8)]
    split = trainer_client.create_lora_training_client(BASE, rank=8, seed=2).result()
    whole = trainer_client.create_lora_training_client(BASE, rank=8, seed=2).result()
    split.forward_backward(data[:2], "cross_entropy").result()
    split.forward_backward(data[2:], "cross_entropy").result()
    split.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    step(whole, data, lr=1e-2)
    a = split.forward(data, "cross_entropy").result().metrics["loss:sum"]
    b = whole.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert a == pytest.approx(b, rel=1e-5)


def test_rl_losses_run_through_the_sdk(trainer_client: tinker.ServiceClient) -> None:
    tc = trainer_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    tokens = sequences(2, length=12, seed=9)
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1]),
            loss_fn_inputs={
                "target_tokens": t[1:],
                "logprobs": [-7.0] * 11,
                "advantages": [1.0] * 11,
            },
        )
        for t in tokens
    ]
    for loss_fn in ("importance_sampling", "ppo", "cispo", "dro"):
        out = tc.forward_backward(data, loss_fn).result()
        assert np.isfinite(out.metrics["loss:sum"]), loss_fn
        assert len(out.loss_fn_outputs) == 2
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def test_gspo_raises_the_sampled_tokens(service_client: tinker.ServiceClient) -> None:
    """Positive advantages on the sampled rows: a few steps raise their logprobs (prompt rows carry 0)."""
    prompt_rows, sampled_rows = 4, 7
    tokens = sequences(2, length=prompt_rows + sampled_rows + 1, seed=10)
    mask = [0.0] * prompt_rows + [1.0] * sampled_rows
    tc = service_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    plain = [datum(t) for t in tokens]
    before = [o["logprobs"].to_numpy() for o in tc.forward(plain, "cross_entropy").result().loss_fn_outputs]
    data = [types.Datum(model_input=types.ModelInput.from_ints(t[:-1]),
                        loss_fn_inputs={"target_tokens": t[1:], "logprobs": [q * m for q, m in zip(lp, mask)],
                                        "advantages": mask, "sequence_ratio_mask": mask})
            for t, lp in zip(tokens, before)]
    for _ in range(3):
        tc.forward_backward(data, "gspo").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = [o["logprobs"].to_numpy() for o in tc.forward(plain, "cross_entropy").result().loss_fn_outputs]
    gain = sum((a - b)[prompt_rows:].sum() for a, b in zip(after, before))
    assert gain > 0, gain

    no_provenance = [types.Datum(model_input=types.ModelInput.from_ints(tokens[0][:-1]),
                                 loss_fn_inputs={"target_tokens": tokens[0][1:], "logprobs": mask, "advantages": mask})]
    with pytest.raises(tinker.BadRequestError, match="needs provenance"):  # refused at submission
        tc.forward_backward(no_provenance, "stable_reinforce").result()
    unrecorded = [no_provenance[0].with_provenance(
        model_input=[types.SampledProvenanceSpan(sequence_id="never-sampled", length=len(tokens[0]) - 1)],
        loss_fn_inputs=[types.SampledProvenanceSpan(sequence_id="never-sampled", length=len(tokens[0]) - 1)])]
    with pytest.raises(tinker.BadRequestError, match="no stability record of sequence_id 'never-sampled'"):
        tc.forward_backward(unrecorded, "stable_reinforce").result()


@AND_JAX
def test_work_that_can_never_run_is_refused_at_submission(trainer_client: tinker.ServiceClient) -> None:
    """Every trainer refuses by the same rules when the request arrives (a 400), not when it would run."""
    tc = trainer_client.create_lora_training_client(BASE, rank=4).result()
    too_long = datum(list(np.arange(2050) % 1000))
    with pytest.raises(tinker.BadRequestError, match="datum 0: 2049 tokens exceed the maximum context length 2048"):
        tc.forward_backward([too_long], "cross_entropy").result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="datum 1: token id 999999 is outside the vocabulary"):
        tc.forward([datum([1, 2, 3]), datum([1, 2, 999_999, 4])], "cross_entropy").result(timeout=60)
