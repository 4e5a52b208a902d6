"""Bad input to the torch backend is a UserError (or NotFound/Conflict) that says what is wrong; a bad batch
is refused the same way at submission (`check_batch`) as at execution."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import TINY_MAX_LEN, TINY_NAME, TINY_VOCAB, ce, datum

from tx.optimizers import AdamParams
from tx.types import (
    ConflictError,
    Datum,
    ForwardBackwardInput,
    ImageChunk,
    LoraConfig,
    ModelInput,
    NotFoundError,
    TextChunk,
    UserError,
)

RL = {"logprobs": [0.0, 0.0, 0.0], "advantages": [1.0, 1.0, 1.0]}


@pytest.fixture
def run(backend):
    backend.create_model("m", TINY_NAME, LoraConfig(rank=2, seed=0))
    return backend


def _fb(backend, data, loss_fn="cross_entropy", config=None):
    """A bad batch, refused at submission (`check_batch`) and at execution with the same UserError."""
    batch = ForwardBackwardInput(data, loss_fn, config or {})
    with pytest.raises(UserError) as submitted:
        backend.check_batch(TINY_NAME, batch)
    with pytest.raises(UserError) as executed:
        backend.forward_backward("m", batch)
    assert str(submitted.value) == str(executed.value)
    raise executed.value


def test_unknown_loss_lists_the_supported_ones(run):
    with pytest.raises(UserError, match="supported.*cross_entropy.*ppo"):
        _fb(run, [datum([1, 2, 3], target_tokens=[2, 3, 4])], "nope")


def test_missing_key_names_key_and_datum(run):
    good = datum([1, 2, 3], target_tokens=[2, 3, 4], **RL)
    bad = datum([1, 2, 3], target_tokens=[2, 3, 4], logprobs=[0.0, 0.0, 0.0])
    with pytest.raises(UserError, match=r"datum 1.*'advantages'"):
        _fb(run, [good, bad], "ppo")
    with pytest.raises(UserError, match=r"datum 0.*'target_tokens'"):
        _fb(run, [datum([1, 2, 3], weights=[1.0, 1.0, 1.0])])


def test_wrong_length_names_the_shapes(run):
    with pytest.raises(UserError, match=r"datum 0.*'target_tokens'.*\(3,\).*\(2,\)"):
        _fb(run, [datum([1, 2, 3], target_tokens=[2, 3])])
    with pytest.raises(UserError, match=r"'weights'.*\(3,\).*\(4,\)"):
        _fb(run, [datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[1.0] * 4)])
    with pytest.raises(UserError, match=r"'advantages'"):
        bad = datum([1, 2, 3], target_tokens=[2, 3, 4], logprobs=[0.0] * 3, advantages=[[1.0]] * 3)
        _fb(run, [bad], "ppo")


def test_wrong_dtype(run):
    float_targets = Datum(ModelInput.from_tokens([1, 2]), {"target_tokens": np.array([2.0, 3.0])})
    with pytest.raises(UserError, match=r"'target_tokens'.*int"):
        _fb(run, [float_targets])
    text_weights = Datum(
        ModelInput.from_tokens([1, 2]), {"target_tokens": np.array([2, 3]), "weights": np.array(["a", "b"])}
    )
    with pytest.raises(UserError, match=r"'weights'.*float32"):
        _fb(run, [text_weights])
    with pytest.raises(UserError, match=r"NaN"):
        _fb(run, [datum([1, 2], target_tokens=[2, 3], weights=[1.0, np.nan])])


def test_tokens_outside_the_vocabulary(run):
    with pytest.raises(UserError, match=rf"token id {TINY_VOCAB}.*\[0, {TINY_VOCAB}\)"):
        _fb(run, [datum([1, TINY_VOCAB, 3], target_tokens=[2, 3, 4])])
    with pytest.raises(UserError, match=r"token id -1"):
        _fb(run, [datum([1, -1, 3], target_tokens=[2, 3, 4])])
    with pytest.raises(UserError, match=rf"'target_tokens'.*{TINY_VOCAB + 5}"):
        _fb(run, [datum([1, 2, 3], target_tokens=[2, 3, TINY_VOCAB + 5])])


def test_too_long(run):
    n = TINY_MAX_LEN + 1
    with pytest.raises(UserError, match=rf"{n} tokens exceed.*{TINY_MAX_LEN}"):
        _fb(run, [datum([1] * n, target_tokens=[1] * n)])


def test_empty_and_image_inputs(run):
    with pytest.raises(UserError, match="at least one datum"):
        _fb(run, [])
    with pytest.raises(UserError, match="empty"):
        _fb(run, [datum([], target_tokens=[])])
    image = ModelInput(chunks=(TextChunk((1, 2)), ImageChunk(b"x", "jpeg", 4)))
    with pytest.raises(UserError, match="text only"):
        _fb(run, [Datum(image, {"target_tokens": np.zeros(6, np.int64)})])


def test_bad_loss_fn_config(run):
    data = [datum([1, 2, 3], target_tokens=[2, 3, 4], **RL)]
    with pytest.raises(UserError, match=r"\['beta'\].*ppo"):
        _fb(run, data, "ppo", {"beta": 0.1})
    with pytest.raises(UserError, match="finite number"):
        _fb(run, data, "ppo", {"clip_low_threshold": "x"})
    with pytest.raises(UserError, match="clip_low_threshold"):
        _fb(run, data, "ppo", {"clip_low_threshold": -0.1})


def test_a_failed_request_leaves_no_grads(run):
    with pytest.raises(UserError):
        _fb(run, [datum([1, 2, 3], target_tokens=[2, 3, 4]), datum([1, 2], target_tokens=[5])])
    assert all(g is None for g in run.gradients("m").values())


def test_unknown_models_and_duplicates(run):
    with pytest.raises(NotFoundError):
        run.base_model_info("other")
    with pytest.raises(NotFoundError):
        run.create_model("x", "other", LoraConfig())
    with pytest.raises(ConflictError):
        run.create_model("m", TINY_NAME, LoraConfig())
    with pytest.raises(NotFoundError):
        run.forward_backward("zzz", ce([datum([1], target_tokens=[2])]))
    with pytest.raises(NotFoundError):
        run.delete_model("zzz")
    with pytest.raises(UserError):
        run.create_model("y", TINY_NAME, LoraConfig(rank=0))
    with pytest.raises(UserError):
        run.optim_step("m", AdamParams(learning_rate=-1.0))


def test_model_info(backend, tiny_model_dir):
    info = backend.base_model_info(TINY_NAME)
    assert info.arch == "Qwen3ForCausalLM"
    assert (info.vocab_size, info.max_context_length) == (TINY_VOCAB, TINY_MAX_LEN)
    assert info.tokenizer_id == str(tiny_model_dir)
    assert backend.served_models() == [info]


def test_the_workers_backend_refuses_at_submission_by_the_same_rules(tiny_model_dir):
    """Its checks at submission need no worker: the rules come from the model's config and the server's cap."""
    from tx.backends.torch.workers.backend import WorkersBackend

    def no_group():
        raise AssertionError("a check at submission started the worker group")

    workers = WorkersBackend({TINY_NAME: tiny_model_dir}, no_group, max_sequence_tokens=10)
    with pytest.raises(UserError, match="datum 0: 11 tokens exceed this server's limit of 10"):
        workers.check_batch(TINY_NAME, ce([datum([1] * 11, target_tokens=[1] * 11)]))
    with pytest.raises(UserError, match=rf"datum 0: token id {TINY_VOCAB}"):
        workers.check_batch(TINY_NAME, ce([datum([1, TINY_VOCAB], target_tokens=[1, 2])]))
    workers.check_batch(TINY_NAME, ce([datum([1, 2], target_tokens=[2, 3])]))
