"""Images through the real SDK: a tiny Qwen3-VL server, the classifier script, refused images and pointers.

Every request goes to loopback. Public, private and link-local address decisions are unit-tested with name
resolution stubbed (`tests/unit/multimodal/test_fetch.py`).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from txserver import TxServer

REPO = Path(__file__).resolve().parents[2]
MAX_PIXELS = 100_000
IM_START, IM_END, VISION_START, VISION_END = 2001, 2002, 2003, 2004


def png(color=(200, 40, 40), size=(64, 48)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


class _Images(BaseHTTPRequestHandler):
    redirect_to = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.end_headers()
            return
        body = png()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _serve(host: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def image_hosts() -> Iterator[tuple[str, str]]:
    """An allowed image server on 127.0.0.1 that redirects to a second one on 127.0.0.2 (also loopback)."""
    allowed, other = _serve("127.0.0.1"), _serve("127.0.0.2")
    _Images.redirect_to = f"http://127.0.0.2:{other.server_port}/img.png"
    yield f"http://127.0.0.1:{allowed.server_port}", _Images.redirect_to
    allowed.shutdown()
    other.shutdown()


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[TxServer, str, Path]:
    from tx.models.tiny_vlm import write_tiny_vlm

    root = tmp_path_factory.mktemp("vlm")
    model_dir = write_tiny_vlm(root / "tiny-vlm", seed=0)
    assets = root / "assets"
    assets.mkdir()
    (assets / "red.png").write_bytes(png())
    (root / "outside.png").write_bytes(png())
    args = ["--base-model", str(model_dir), "--no-engine-colocate", "--image-max-pixels", str(MAX_PIXELS),
            "--asset-root", str(assets), "--asset-host", "127.0.0.1", "--asset-host", "127.0.0.2",
            "--asset-allowed-network", "127.0.0.1/32"]
    with TxServer(root / "data", args=args, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server, str(model_dir), root


@pytest.fixture(scope="module")
def client(vlm) -> Iterator[tinker.ServiceClient]:
    with vlm[0].client() as service:
        yield service


@pytest.fixture(scope="module")
def trainer(vlm, client) -> tinker.TrainingClient:
    return client.create_lora_training_client(vlm[1], rank=8, seed=0).result()


@pytest.fixture(scope="module")
def sampler(trainer) -> tinker.SamplingClient:
    return trainer.save_weights_and_get_sampling_client().result()


def image_input(image: types.ImageChunk | types.ImageAssetPointerChunk) -> types.ModelInput:
    return types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[IM_START, 10, 11, VISION_START]), image,
                                    types.EncodedTextChunk(tokens=[VISION_END, 12, 13, IM_END])])


def image_datum(expected_tokens: int = 70, data: bytes | None = None) -> types.Datum:
    image = types.ImageChunk(data=data or png(), format="png", expected_tokens=expected_tokens)
    model_input = image_input(image)
    length = model_input.length
    return types.Datum(model_input=model_input, loss_fn_inputs={
        "target_tokens": [0] * length, "weights": [0.0] * (length - 1) + [1.0]})


def user_failure(future) -> str:
    with pytest.raises(tinker.RequestFailedError) as info:
        future.result(timeout=120)
    assert info.value.category.value == "user"
    return str(info.value)


def test_classifier_script_learns(vlm) -> None:
    server, model_dir, root = vlm
    out = root / "history.json"
    command = [sys.executable, str(REPO / "scripts" / "vlm_classifier.py"), "--base-url", server.url,
               "--base-model", model_dir, "--steps", "16", "--eval-every", "8", "--json-out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:] + server.log()[-3000:]
    history = json.loads(out.read_text())
    assert history[0]["step"] == 0 and history[-1]["step"] == 16
    assert history[0]["accuracy"] <= 0.5  # an untrained model does not know the classes (chance is 1/3)
    assert history[-1]["accuracy"] >= 0.75, history


def test_every_position_gets_a_logprob(trainer, sampler) -> None:
    datum = image_datum()
    out = trainer.forward([datum], "cross_entropy").result()
    trained = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert trained.shape == (datum.model_input.length,) == (4 + 70 + 4,)
    assert np.isfinite(trained).all()
    prompt = sampler.compute_logprobs(datum.model_input).result()
    assert len(prompt) == datum.model_input.length and prompt[0] is None
    assert all(isinstance(value, float) for value in prompt[1:])  # image positions included
    ids = [IM_START, 10, 11, VISION_START, *[0] * 70, VISION_END, 12, 13, IM_END]
    image_token = 2005
    ids = [image_token if 4 <= i < 74 else t for i, t in enumerate(ids)]
    # the trainer's logprob of the next token equals the sampler's prompt logprob (text positions)
    next_text = [i for i in range(1, len(ids)) if not 4 <= i < 74]
    targets = types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": ids[1:] + [0], "weights": [1.0] * len(ids)})
    shifted = trainer.forward([targets], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose([prompt[i] for i in next_text], shifted[[i - 1 for i in next_text]], atol=1e-3)


def test_sampling_from_an_image_prompt(sampler) -> None:
    image = types.ImageChunk(data=png((20, 200, 20)), format="png", expected_tokens=70)
    params = types.SamplingParams(max_tokens=5, temperature=1.0, seed=1)
    result = sampler.sample(image_input(image), 2, params)
    sequences = result.result().sequences
    assert len(sequences) == 2
    assert all(len(s.tokens) >= 1 and len(s.logprobs) == len(s.tokens) for s in sequences)


def test_wrong_expected_tokens_is_a_user_error(trainer, sampler) -> None:
    message = user_failure(trainer.forward_backward([image_datum(expected_tokens=69)], "cross_entropy"))
    assert "69" in message and "70" in message
    image = types.ImageChunk(data=png(), format="png", expected_tokens=71)
    message = user_failure(sampler.sample(image_input(image), 1, types.SamplingParams(max_tokens=2)))
    assert "71" in message and "70" in message


def test_corrupt_and_oversized_images_are_user_errors(trainer, sampler) -> None:
    corrupt = png()[:60]
    assert "corrupt" in user_failure(trainer.forward([image_datum(data=corrupt)], "cross_entropy"))
    big = types.ImageChunk(data=png(size=(400, 300)), format="png", expected_tokens=165)
    message = user_failure(sampler.sample(image_input(big), 1, types.SamplingParams(max_tokens=2)))
    assert "pixels" in message and str(MAX_PIXELS) in message
    big_datum = image_datum(expected_tokens=165, data=big.data)
    message = user_failure(trainer.forward([big_datum], "cross_entropy"))
    assert str(MAX_PIXELS) in message


def pointer(location: str) -> types.ModelInput:
    return image_input(types.ImageAssetPointerChunk(location=location, format="png", expected_tokens=70))


def test_allowed_pointers_sample(vlm, sampler, image_hosts) -> None:
    allowed, _ = image_hosts
    params = types.SamplingParams(max_tokens=2, temperature=0.0)
    for location in (str(vlm[2] / "assets" / "red.png"), f"file://{vlm[2] / 'assets' / 'red.png'}",
                     f"{allowed}/img.png"):
        assert sampler.sample(pointer(location), 1, params).result().sequences[0].tokens


@pytest.mark.parametrize("case", ["outside_roots", "traversal", "loopback", "redirect_to_loopback", "host"])
def test_refused_pointers(vlm, sampler, image_hosts, case: str) -> None:
    allowed, loopback = image_hosts
    location, reason = {
        "outside_roots": (str(vlm[2] / "outside.png"), "no file under the asset roots"),
        "traversal": (str(vlm[2] / "assets" / ".." / "outside.png"), "no file under the asset roots"),
        "loopback": (loopback, "loopback address 127.0.0.2"),
        "redirect_to_loopback": (f"{allowed}/redirect", "loopback address 127.0.0.2"),
        "host": ("http://localhost:9/img.png", "not one this server may fetch from"),
    }[case]
    message = user_failure(sampler.sample(pointer(location), 1, types.SamplingParams(max_tokens=2)))
    assert reason in message
