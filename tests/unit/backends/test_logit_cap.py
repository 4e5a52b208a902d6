"""The logit-softcap self-check (`tx/backends/torch/logit_cap.py`): the trainer's head gives a model's own logits,
softcapped where the model softcaps them, and a model whose logits are neither is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tx.backends.torch.head import Softcapped, softcapped
from tx.backends.torch.logit_cap import choose_logit_cap
from tx.models import write_tiny_model
from tx.models.auto import load_frozen
from tx.types import UserError


def _load(directory: Path):
    return load_frozen(directory, torch.device("cpu"), torch.float32, "eager")


def _gemma3(tmp_path: Path, cap: float | None) -> Path:
    directory = write_tiny_model(tmp_path / f"gemma3-{cap}", preset="gemma3")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": cap}))
    return directory


def test_a_model_without_a_softcap_gets_its_head_as_is(tiny_model_dir: Path) -> None:
    assert choose_logit_cap(_load(tiny_model_dir), "tiny") is None


def test_a_softcapping_model_gets_its_cap_from_the_check(tmp_path: Path) -> None:
    model = _load(_gemma3(tmp_path, 30.0))  # Gemma 3 softcaps its logits where its config says so
    assert choose_logit_cap(model, "gemma3") == 30.0
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits[0]
        hidden = model.model(input_ids=ids).last_hidden_state[0]
        got = softcapped(model.lm_head, 30.0)(hidden)
    assert isinstance(softcapped(model.lm_head, 30.0), Softcapped)
    assert softcapped(model.lm_head, None) is model.lm_head
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (want - model.lm_head(hidden)).abs().max() > 1e-3  # the cap is not a no-op on these logits


def test_a_cap_the_model_does_not_apply_is_not_taken(tmp_path: Path) -> None:
    model = _load(_gemma3(tmp_path, 30.0))
    model.config.final_logit_softcapping = None  # the forward reads it: logits as the head gives them
    assert choose_logit_cap(model, "gemma3") is None


def test_logits_that_are_neither_are_refused(tmp_path: Path) -> None:
    model = _load(_gemma3(tmp_path, 30.0))
    original = model.forward

    def scaled(*args, **kwargs):  # a model doing more to its head's output than the softcap its config names
        out = original(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out

    model.forward = scaled
    with pytest.raises(UserError, match=r"gemma3: its logits are not its head's output, softcapped or not "
                                        r"\(softcapped at 30: .*; no softcap: .*\)"):
        choose_logit_cap(model, "gemma3")
