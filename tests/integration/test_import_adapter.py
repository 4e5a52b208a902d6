"""`tx checkpoints import`: a PEFT LoRA trained elsewhere becomes a tinker:// checkpoint of the caller's, which
the SDK loads with create_training_client_from_state, trains and samples, computing what the adapter computes
(docs/operations.md#adapters-trained-elsewhere). A bad adapter is refused with a clear error and leaves nothing."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from conftest import Trained
from peft import LoraConfig, PeftModel, get_peft_model
from reference_logprobs import token_logprobs
from sampling_options import sampled_in_full
from sdk_datums import sft_datum
from tinker import types
from transformers import AutoModelForCausalLM
from txserver import API_KEY, TxServer

from tx import cli

TOKENS = np.random.default_rng(3).integers(10, 1990, size=20).tolist()


def outside_adapter(server: TxServer, into: Path, **config) -> Path:
    """A PEFT adapter as another trainer writes one: its own targets, rank and alpha, B far from zero."""
    base = AutoModelForCausalLM.from_pretrained(server.data_dir / "models" / "tiny-qwen3", dtype=torch.float32)
    torch.manual_seed(0)
    options = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"],
               "init_lora_weights": False, **config}
    model = get_peft_model(base, LoraConfig(**options))
    model.save_pretrained(str(into))
    return into


def run_import(server: TxServer, directory: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    return cli.main(["checkpoints", "import", str(directory), "--base-model", "tiny-qwen3", *args])


@pytest.mark.parametrize("trainer", ["server", "workers_server", "jax_server"])
def test_an_outside_adapter_loads_trains_and_samples_as_it_computes(
    trainer: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """On every trainer: in the server process, on trainer workers, and JAX (the state is each one's own)."""
    server: TxServer = request.getfixturevalue(trainer)
    adapter = outside_adapter(server, tmp_path / "their-adapter")
    assert run_import(server, adapter, monkeypatch) == 0
    path = capsys.readouterr().out.strip().splitlines()[-1]
    assert path.startswith("tinker://") and path.endswith("/weights/their-adapter")
    base = AutoModelForCausalLM.from_pretrained(server.data_dir / "models" / "tiny-qwen3", dtype=torch.float32)
    expected = np.array(token_logprobs(PeftModel.from_pretrained(base, str(adapter)).eval(), TOKENS[:1], TOKENS[1:]))
    with server.client() as service:
        tc = service.create_training_client_from_state_with_optimizer(path).result()
        out = tc.forward([sft_datum(TOKENS)], "cross_entropy").result()
        np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"].to_numpy(), expected, atol=1e-4)
        losses = []
        for _ in range(3):
            step = tc.forward_backward([sft_datum(TOKENS)], "cross_entropy").result()
            losses.append(step.metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert losses[-1] < losses[0]
        sampler = tc.save_weights_and_get_sampling_client("imported-sampler")
        sampled = sampler.sample(types.ModelInput.from_ints(TOKENS[:5]), 2, types.SamplingParams(max_tokens=4)).result()
        assert all(sampled_in_full(s, 4) for s in sampled.sequences), sampled.sequences
    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    run_id = path.removeprefix("tinker://").split("/")[0]
    listed = rest.list_checkpoints(run_id).result().checkpoints
    assert [c.checkpoint_id for c in listed] == ["weights/their-adapter"]
    assert "optimizer state starts fresh" in server.log()


def test_an_adapter_tx_exported_imports_back_as_the_run_it_came_from(
    server: TxServer, trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """save_weights_external, downloaded by its signed URLs, imported: the trainer's logprobs (1e-5, float32).
    Every family's round trip: tests/unit/backends/test_import_families.py."""
    external = trained.tc.save_weights_external("for-import", ttl_seconds=3600).result().path
    adapter = tmp_path / "downloaded"
    adapter.mkdir()
    for name, url in trained.rest.get_external_weights_urls(external).result().urls.items():
        with urllib.request.urlopen(url, timeout=30) as response:
            (adapter / name).write_bytes(response.read())
    assert run_import(server, adapter, monkeypatch, "--name", "round-trip") == 0
    path = capsys.readouterr().out.strip().splitlines()[-1]
    with server.client() as service:
        tc = service.create_training_client_from_state(path).result()
        out = tc.forward([sft_datum(trained.tokens)], "cross_entropy").result()
    np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"].to_numpy(), trained.trainer_logprobs(), atol=1e-5)


@pytest.mark.parametrize(("config", "says"), [
    ({"base_model_name_or_path": "meta-llama/Llama-3.2-1B"}, "made for 'meta-llama/Llama-3.2-1B'"),
    ({"target_modules": ["embed_tokens"]}, "where tx places no LoRA"),
    ({"use_dora": True}, "DoRA"),
    ({"r": 4096}, "rank"),
])
def test_a_bad_adapter_is_refused_and_leaves_nothing(
    server: TxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    config: dict, says: str,
) -> None:
    edited = "r" in config or "base_model_name_or_path" in config
    adapter = outside_adapter(server, tmp_path / "bad", **({} if edited else config))
    if edited:  # a config no PEFT model would be built with, or one written for another base
        written = json.loads((adapter / "adapter_config.json").read_text())
        (adapter / "adapter_config.json").write_text(json.dumps({**written, **config}))
    before = len(list((server.data_dir / "checkpoints").glob("*/weights/bad")))
    assert run_import(server, adapter, monkeypatch) != 0
    assert says in capsys.readouterr().err
    assert len(list((server.data_dir / "checkpoints").glob("*/weights/bad"))) == before == 0
    assert not any((server.data_dir / "checkpoints" / ".uploads").glob("*"))


def test_a_pickled_adapter_is_refused_before_upload(
    server: TxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    adapter = outside_adapter(server, tmp_path / "pickled")
    (adapter / "adapter_model.safetensors").rename(adapter / "adapter_model.bin")
    assert run_import(server, adapter, monkeypatch) == 2
    assert "pickle" in capsys.readouterr().err
