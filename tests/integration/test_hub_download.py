"""`tx serve --base-model <hub id>` downloads the model before it reports ready, then serves it; a later start
`--offline` serves it from the cache with no hub at all. The hub is a STAND-IN on 127.0.0.1 (tests/hub_standin.py:
the real hub is not reachable from CI) serving the tiny model through the hub's HTTP API; only HF_ENDPOINT points
at it."""

from __future__ import annotations

from pathlib import Path

import httpx
from hub_standin import HubStandIn
from sampling_options import sampled_in_full
from tinker import types
from txserver import API_KEY, TxServer

from tx.models.fingerprint import model_fingerprint

NAME = "Qwen/Qwen3-8B"  # the name a user types; the stand-in serves the tiny Qwen3 under it


def test_serve_downloads_a_named_model_with_progress_then_samples(tmp_path: Path, tiny_model_dir: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    with HubStandIn() as hub:
        hub.add(NAME, tiny_model_dir)
        server = TxServer(tmp_path / "tx", args=["--base-model", NAME], env={**env, "HF_ENDPOINT": hub.url})
        with server:
            with server.client() as client:
                sampler = client.create_sampling_client(base_model=NAME)
                result = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1,
                                        types.SamplingParams(max_tokens=2)).result()
            assert sampled_in_full(result.sequences[0], 2), result.sequences
            log = server.log()
    assert "Fetching 6 files: 100%" in log  # huggingface_hub's progress bar, on the terminal (stderr)
    started = log.index(f"downloading {NAME} from {hub.url}: 6 files, 1.6 MB to fetch")
    assert started < log.index(f"downloaded {NAME} (1.6 MB)") < log.index("Application startup complete")
    snapshot = next((tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots").iterdir())
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())

    offline = TxServer(tmp_path / "tx", args=["--base-model", NAME, "--offline"],
                       env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})  # the stand-in is gone: no hub at all
    with offline:
        assert "downloading" not in offline.log() and "serving base models: Qwen/Qwen3-8B" in offline.log()
        with offline.client() as client:  # a run records the hub commit it was created on (issue 43)
            run_id = client.create_lora_training_client(NAME, rank=4).result().model_id
        run = httpx.get(f"{offline.url}/api/v1/training_runs/{run_id}", headers={"X-API-Key": API_KEY}, timeout=30)
        assert run.json()["base_revision"] == snapshot.name and len(snapshot.name) == 40
        assert run.json()["base_fingerprint"] == model_fingerprint(snapshot)
