"""`tx serve --ray-address local`: engines run as Ray actors; the SDK samples through them."""

from __future__ import annotations

import pytest
from sampling_options import sampled_in_full
from tinker import types
from txserver import TxServer

ray = pytest.importorskip("ray")
if not hasattr(ray, "init"):
    pytest.skip("ray is not installed (pip install 'tx[ray]')", allow_module_level=True)
pytestmark = pytest.mark.ray


def test_serve_places_engines_as_ray_actors(tmp_path) -> None:
    server = TxServer(tmp_path / "data", args=["--ray-address", "local", "--engine-count", "2"],
                      env={"RAY_AUTH_MODE": "disabled"})
    with server.start(timeout_s=180), server.client() as client:
        tc = client.create_lora_training_client("tiny-qwen3", rank=4).result()
        sampler = tc.save_weights_and_get_sampling_client()
        out = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 2, types.SamplingParams(max_tokens=5)).result()
        assert len(out.sequences) == 2 and all(sampled_in_full(s, 5) for s in out.sequences), out.sequences
        engines = server.engine_groups()[0]["engines"]
        assert len(engines) == 2 and all(e["alive"] for e in engines)
