"""`tx checkpoints merge`: the server merges a checkpoint into its base model and keeps it as
`external_weights/<name>`, which downloads with signed links and loads in plain transformers as the served
model (docs/operations.md#merging-on-the-server)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Trained
from transformers import AutoModelForCausalLM

from reference_logprobs import token_logprobs
from tx import cli
from txserver import API_KEY, TxServer


@pytest.fixture
def as_user(server: TxServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)


@pytest.mark.usefixtures("as_user")
def test_a_merge_on_the_server_downloads_and_loads_as_the_served_model(
    trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cli.main(["checkpoints", "merge", trained.state_path, "--name", "merged"]) == 0
    path = capsys.readouterr().out.strip()
    assert path == f"tinker://{trained.tc.model_id}/external_weights/merged"
    urls = trained.rest.get_external_weights_urls(path).result().urls
    assert "config.json" in urls and any(name.endswith(".safetensors") for name in urls)
    for name, url in urls.items():
        with urllib.request.urlopen(url, timeout=60) as response:  # no key: the signed URL is the credential
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(response.read())
    merged = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    got = np.array(token_logprobs(merged, trained.tokens[:1], trained.tokens[1:]))
    np.testing.assert_allclose(got, trained.trainer_logprobs(), atol=1e-4)
    listed = {c.checkpoint_id: c for c in trained.rest.list_checkpoints(trained.tc.model_id).result().checkpoints}
    assert listed["external_weights/merged"].size_bytes > 0
    assert cli.main(["checkpoints", "merge", trained.state_path, "--name", "merged"]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.usefixtures("as_user")
def test_a_merge_of_what_the_caller_cannot_read_is_refused(
    trained: Trained, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-merge-stranger")
    assert cli.main(["checkpoints", "merge", trained.state_path, "--name", "theirs"]) == 2
    assert "404" in capsys.readouterr().err
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    assert cli.main(["checkpoints", "merge", "tinker://nope/weights/x", "--name", "y"]) == 2
    assert cli.main(["checkpoints", "merge", trained.state_path, "--name", "bad name!"]) == 2
    assert "invalid checkpoint name" in capsys.readouterr().err
