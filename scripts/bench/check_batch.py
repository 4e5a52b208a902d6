"""What refusing bad work at submission costs: `check_batch` on a forward_backward of real size, in process.

A cross_entropy batch of `--batch` datums x `--seq-len` tokens (the cookbook's SFT batch, 128 x 2,048, by
default) against Qwen3's vocabulary (151,936) and context (40,960). Prints JSON, the median of `--repeats`
runs of each, side by side:
- `decode_s`: what the route already does before the check (protobuf parse + conversion to domain datums);
- `check_s`: `check_batch` at submission (`tx/backends/datums.py`);
- `prepare_s`: the trainer's own checks and layout at execution (`prepare_data`, text model), for scale.

    python scripts/bench/check_batch.py [--batch 128] [--seq-len 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from tx.api.wire.codec import forward_backward_input_from_proto, parse_forward_backward_request
from tx.backends.datums import DatumRules, check_batch
from tx.backends.losses import get_loss
from tx.backends.torch.batch import prepare_data
from tx.types import BaseModelInfo

QWEN3 = BaseModelInfo(name="qwen3", arch="Qwen3ForCausalLM", tokenizer_id="-", vocab_size=151_936,
                      max_context_length=40_960)


def request_body(batch: int, seq_len: int) -> bytes:
    rng = np.random.default_rng(0)
    data = []
    for _ in range(batch):
        tokens = rng.integers(0, QWEN3.vocab_size, size=seq_len + 1).tolist()
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
            "target_tokens": tokens[1:], "weights": [1.0] * seq_len}))
    request = types.ForwardBackwardRequest(model_id="m", seq_id=1, forward_backward_input=types.ForwardBackwardInput(
        data=data, loss_fn="cross_entropy"))
    return forward_backward_request_to_proto(request).SerializeToString()


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    body = request_body(args.batch, args.seq_len)

    def decode():
        return forward_backward_input_from_proto(parse_forward_backward_request(body, None, zstd_enabled=False))

    batch, rules = decode(), DatumRules(QWEN3)
    result = {
        "batch": args.batch,
        "seq_len": args.seq_len,
        "tokens": args.batch * args.seq_len,
        "body_bytes": len(body),
        "decode_s": median_s(decode, args.repeats),
        "check_s": median_s(lambda: check_batch(batch, rules), args.repeats),
        "prepare_s": median_s(lambda: prepare_data(batch.data, get_loss("cross_entropy"), QWEN3), args.repeats),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
