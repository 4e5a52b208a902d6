"""Export and download: save_weights_external, signed URLs (rows 16, 34), age encryption, and
`tx checkpoints export --merge`, checked by loading the files the way a user would (PEFT, HF)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pyrage
import pytest
import tinker
import torch
from conftest import Trained
from peft import PeftModel
from transformers import AutoModelForCausalLM

from reference_logprobs import token_logprobs
from tx import cli
from txserver import API_KEY, TxServer


def base_dir(server: TxServer) -> Path:
    return server.data_dir / "models" / "tiny-qwen3"


def download(urls: dict[str, str], into: Path) -> None:
    for name, url in urls.items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=30) as response:  # no API key: the URL is the credential
            (into / name).write_bytes(response.read())


def hf_logprobs(model, tokens: list[int]) -> np.ndarray:
    return np.array(token_logprobs(model, tokens[:1], tokens[1:]))


@pytest.fixture(scope="module")
def external(trained: Trained) -> str:
    return trained.tc.save_weights_external("ext", ttl_seconds=7200).result().path


def test_external_weights_download_and_load_with_peft(
    server: TxServer, trained: Trained, external: str, tmp_path: Path
) -> None:
    assert external == f"tinker://{trained.tc.model_id}/external_weights/ext"
    response = trained.rest.get_external_weights_urls(external).result()
    assert set(response.urls) == {"adapter_config.json", "adapter_model.safetensors"}
    download(response.urls, tmp_path)
    base = AutoModelForCausalLM.from_pretrained(base_dir(server), dtype=torch.float32)
    before = hf_logprobs(base, trained.tokens)
    model = PeftModel.from_pretrained(base, str(tmp_path)).eval()
    expected = trained.trainer_logprobs()
    assert np.abs(before - expected).max() > 1e-3  # the adapter really changes the model
    np.testing.assert_allclose(hf_logprobs(model, trained.tokens), expected, atol=1e-5)
    listed = {c.checkpoint_id: c for c in trained.rest.list_checkpoints(trained.tc.model_id).result().checkpoints}
    assert listed["external_weights/ext"].checkpoint_type == "external"
    assert listed["external_weights/ext"].expires_at is not None


def test_signed_urls_serve_ranges_and_nothing_else(server: TxServer, trained: Trained, external: str) -> None:
    url = trained.rest.get_external_weights_urls(external).result().urls["adapter_model.safetensors"]
    whole = httpx.get(url).content
    part = httpx.get(url, headers={"Range": "bytes=8-23"})
    assert part.status_code == 206 and part.content == whole[8:24]
    assert part.headers["content-range"] == f"bytes 8-23/{len(whole)}"
    token = url.rsplit("/", 1)[1]
    payload, mac = token.split(".")
    forged = httpx.get(url.replace(token, f"{payload[:-2]}AA.{mac}"))
    assert forged.status_code == 404 and forged.json()["detail"]
    other = tinker.RestClient(base_url=server.url, api_key="tml-someone-else")
    with pytest.raises(tinker.NotFoundError):
        other.get_external_weights_urls(external).result()
    run, checkpoint_id = trained.state_path.removeprefix("tinker://").split("/", 1)
    r = httpx.get(f"{server.url}/api/v1/training_runs/{run}/checkpoints/{checkpoint_id}/external_weights_urls",
                  headers={"X-API-Key": API_KEY})
    assert r.status_code == 400 and "external_weights" in r.json()["detail"]  # only exports have URLs


def test_deleting_an_export_frees_its_files_and_kills_its_links(server: TxServer, trained: Trained) -> None:
    path = trained.tc.save_weights_external("short-lived").result().path
    urls = trained.rest.get_external_weights_urls(path).result().urls
    directory = server.data_dir / "checkpoints" / trained.tc.model_id / "external_weights" / "short-lived"
    assert directory.is_dir()
    trained.rest.delete_checkpoint_from_tinker_path(path).result()
    assert not directory.exists()
    assert all(httpx.get(u).status_code == 404 for u in urls.values())


def test_a_link_dies_with_its_checkpoint_not_with_its_name(server: TxServer, trained: Trained) -> None:
    """The shared-server probe's finding 7: a link worked again for a new checkpoint saved under the same name.
    Links name the checkpoint's creation id."""
    path = trained.tc.save_weights_external("reused").result().path
    urls = trained.rest.get_external_weights_urls(path).result().urls
    assert all(httpx.get(u).status_code == 200 for u in urls.values())
    trained.rest.delete_checkpoint_from_tinker_path(path).result()
    assert trained.tc.save_weights_external("reused").result().path == path
    gone = [httpx.get(u) for u in urls.values()]
    assert all(r.status_code == 404 and "saved again" in r.json()["detail"] for r in gone)
    fresh = trained.rest.get_external_weights_urls(path).result().urls
    assert all(httpx.get(u).status_code == 200 for u in fresh.values())


def test_age_encrypted_export_decrypts_to_the_adapter(trained: Trained, external: str, tmp_path: Path) -> None:
    identity = pyrage.x25519.Identity.generate()
    path = trained.tc.save_weights_external("sealed", age_encryption_recipients=[str(identity.to_public())]).result().path
    urls = trained.rest.get_external_weights_urls(path).result().urls
    assert set(urls) == {"adapter_config.json.age", "adapter_model.safetensors.age"}
    download(urls, tmp_path / "sealed")
    download(trained.rest.get_external_weights_urls(external).result().urls, tmp_path / "plain")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        sealed = (tmp_path / "sealed" / f"{name}.age").read_bytes()
        assert sealed.startswith(b"age-encryption.org/v1")
        assert pyrage.decrypt(sealed, [identity]) == (tmp_path / "plain" / name).read_bytes()


def test_bad_age_recipient_is_refused_at_submission(trained: Trained) -> None:
    with pytest.raises(tinker.BadRequestError, match="age recipient"):
        trained.tc.save_weights_external("bad", age_encryption_recipients=["age1notakey"]).result()


def test_merged_export_equals_the_adapter(
    server: TxServer, trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "merged"
    argv = ["checkpoints", "export", trained.state_path, "--merge", str(out), "--data-dir", str(server.data_dir)]
    assert cli.main(argv) == 0  # in-process: the same code path as the `tx` command, without a second torch import
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any("lora" in name for name in merged.state_dict())
    np.testing.assert_allclose(hf_logprobs(merged, trained.tokens), trained.trainer_logprobs(), atol=1e-4)
    assert cli.main(argv) == 2 and "already exists" in capsys.readouterr().err
