"""A vision-language classifier trained over the tinker SDK: LoRA SFT on synthetic colour images.

    python scripts/vlm_classifier.py                      # starts its own tx server on a tiny random Qwen3-VL
    python scripts/vlm_classifier.py --base-url URL --base-model NAME   # uses a running server

The dataset is noisy solid-colour images (64x48, so 70 image tokens with the Qwen3-VL processor), one class
per colour. Each training example is a ChatML turn: the user sends the image and a question, the assistant
answers with the class name; only the answer (and its end token) is trained. Evaluation samples greedily on
held-out images, from the weights of that step, and counts exact answers. Accuracy is printed per eval step
(step 0 is before any training; chance is 1 / number of classes).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 50, 220), "yellow": (230, 220, 30)}
QUESTION = "What colour is this?"


@dataclass(frozen=True)
class Example:
    png: bytes
    label: str


def make_images(classes: list[str], per_class: int, rng: np.random.Generator) -> list[Example]:
    """Solid colours with per-image brightness jitter and per-pixel noise, encoded as PNG."""
    from PIL import Image

    examples = []
    for label in classes:
        for _ in range(per_class):
            base = np.array(COLOURS[label], dtype=np.float32) * rng.uniform(0.75, 1.15)
            pixels = base[None, None, :] + rng.normal(0, 25, size=(48, 64, 3))
            buffer = io.BytesIO()
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
            examples.append(Example(buffer.getvalue(), label))
    rng.shuffle(examples)
    return examples


class Prompter:
    """ChatML prompts with one image, built from the model's tokenizer and image processor."""

    def __init__(self, tokenizer_id: str) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_id)
        self.processor = AutoImageProcessor.from_pretrained(tokenizer_id)
        self.end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def image_tokens(self, png: bytes) -> int:
        """What the cookbook computes: the processor's patch count / merge_size**2."""
        from PIL import Image

        width, height = Image.open(io.BytesIO(png)).size
        merge = self.processor.merge_size
        return self.processor.get_number_of_image_patches(height, width, images_kwargs={}) // merge**2

    def prompt(self, png: bytes):
        from tinker import types

        return [
            types.EncodedTextChunk(tokens=self.encode("<|im_start|>user\n<|vision_start|>")),
            types.ImageChunk(data=png, format="png", expected_tokens=self.image_tokens(png)),
            types.EncodedTextChunk(
                tokens=self.encode(f"<|vision_end|>{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
            ),
        ]

    def datum(self, example: Example):
        """Input = prompt + answer minus its last token; targets = the next position's token (0 at image
        positions); weight 1 on the answer tokens only (reduction "sum" over the batch)."""
        from tinker import types

        text_before, image, text_after = self.prompt(example.png)
        answer = self.encode(example.label) + [self.end_id]
        full = [*text_before.tokens, *[0] * image.expected_tokens, *text_after.tokens, *answer]
        prompt_len = len(full) - len(answer)
        targets = np.array(full[1:], dtype=np.int64)
        weights = (np.arange(1, len(full)) >= prompt_len).astype(np.float32)
        chunks = [text_before, image, types.EncodedTextChunk(tokens=[*text_after.tokens, *answer[:-1]])]
        return types.Datum(
            model_input=types.ModelInput(chunks=chunks),
            loss_fn_inputs={"target_tokens": targets.tolist(), "weights": weights.tolist()},
        )


def evaluate(sampler, prompter: Prompter, examples: list[Example]) -> float:
    from tinker import types

    params = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[prompter.end_id])
    futures = [sampler.sample(types.ModelInput(chunks=prompter.prompt(e.png)), 1, params) for e in examples]
    correct = 0
    for future, example in zip(futures, examples):
        tokens = [t for t in future.result().sequences[0].tokens if t != prompter.end_id]
        correct += prompter.tokenizer.decode(tokens).strip() == example.label
    return correct / len(examples)


def train(args: argparse.Namespace, base_url: str) -> list[dict]:
    import tinker
    from tinker import types

    rng = np.random.default_rng(args.seed)
    classes = list(COLOURS)[: args.num_classes]
    train_set = make_images(classes, args.train_per_class, rng)
    test_set = make_images(classes, args.test_per_class, rng)
    service = tinker.ServiceClient(base_url=base_url, api_key=os.environ.get("TINKER_API_KEY", "tml-local"))
    client = service.create_lora_training_client(args.base_model, rank=args.rank, seed=args.seed).result()
    prompter = Prompter(client.get_info().model_data.tokenizer_id)
    data = [prompter.datum(example) for example in train_set]
    num_answer_tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in data)
    history, start, loss = [], time.monotonic(), float("nan")
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            sampler = client.save_weights_and_get_sampling_client().result()
            accuracy = evaluate(sampler, prompter, test_set)
            elapsed = round(time.monotonic() - start, 1)
            row = {"step": step, "loss": loss, "accuracy": accuracy, "elapsed_s": elapsed}
            history.append(row)
            print(json.dumps(row), flush=True)
        if step == args.steps:
            break
        fwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=args.lr))
        loss = round(fwd.result().metrics["loss:sum"] / num_answer_tokens, 4)
        optim.result()
    service.close("success")
    return history


def serve_tiny_vlm(workdir: Path) -> tuple[subprocess.Popen, str, str]:
    """Write a tiny random Qwen3-VL and start `tx serve` on it; returns (process, url, model name)."""
    import httpx

    model_dir = workdir / "tiny-vlm"
    subprocess.run([sys.executable, "-m", "tx.cli", "models", "make-tiny", "tiny-vlm", "--preset", "vlm",
                    "--out", str(model_dir)], check=True, capture_output=True)
    port = _free_port()
    log = open(workdir / "server.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tx.cli", "serve", "--port", str(port), "--data-dir", str(workdir / "data"),
         "--base-model", str(model_dir), "--no-engine-colocate"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                return process, url, str(model_dir)
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"tx serve did not start; see {workdir / 'server.log'}")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default=None, help="a running tx server (default: start one)")
    parser.add_argument("--base-model", default=None, help="the served VLM's name (needed with --base-url)")
    parser.add_argument("--num-classes", type=int, default=3, choices=range(2, len(COLOURS) + 1))
    parser.add_argument("--train-per-class", type=int, default=8)
    parser.add_argument("--test-per-class", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path, help="write the accuracy history here")
    args = parser.parse_args(argv)
    if args.base_url and not args.base_model:
        parser.error("--base-url needs --base-model")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    process = None
    with tempfile.TemporaryDirectory(prefix="tx-vlm-classifier-") as workdir:
        try:
            base_url = args.base_url
            if base_url is None:
                process, base_url, args.base_model = serve_tiny_vlm(Path(workdir))
            history = train(args, base_url)
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)
    if args.json_out:
        args.json_out.write_text(json.dumps(history, indent=1))
    best = max(row["accuracy"] for row in history)
    final = history[-1]["accuracy"]
    print(f"chance {1 / args.num_classes:.2f}; best held-out accuracy {best:.2f}; final {final:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
