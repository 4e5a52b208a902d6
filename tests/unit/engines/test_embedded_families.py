"""The embedded engine samples every family: any number of samples, rows that stop at different steps, several
requests in one batch, hybrid (linear-attention) and sliding-window caches; each sampled token's logprob is the
model's own (a plain forward of prompt + sample, 1e-4 in float32).

The engine's scheduler and weights run in this process (no HTTP: the sampling path is what is under test).
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch
from families import FAMILIES
from reference_logprobs import token_logprobs

from tx.inference.engines.embedded.scheduler import Scheduler
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import GenerateRequest, GenerateResponse
from tx.models.auto import load_pretrained

PROMPTS = ([5, 17, 230, 1000, 44], [100, 200, 300, 7, 7, 9, 1500, 3, 900, 12, 8], [64, 2000])
STOPS = list(range(0, 2048, 7))  # ~1 token in 7 stops a row: rows end at different steps


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_samples_many_rows_of_unequal_length(family: str, family_model_dirs) -> None:
    model_dir = family_model_dirs[family]
    weights = Weights(model_dir, max_adapters=1)
    scheduler = Scheduler(weights, max_batch_size=32, batch_wait_s=0.05)
    scheduler.start()
    try:
        requests = [GenerateRequest(prompt_token_ids=list(prompt), n=4, max_tokens=10, seed=i, stop_at_eos=False,
                                    stop_token_ids=STOPS) for i, prompt in enumerate(PROMPTS)]
        futures: list[Future] = [scheduler.submit(request) for request in requests]  # batched together
        responses: list[GenerateResponse] = [future.result(timeout=300) for future in futures]
    finally:
        scheduler.close()
        weights.close()
    reference = load_pretrained(model_dir, dtype=torch.float32).eval()
    lengths = set()
    for prompt, response in zip(PROMPTS, responses, strict=True):
        assert len(response.sequences) == 4
        for sequence in response.sequences:
            lengths.add(len(sequence.token_ids))
            assert sequence.stop_reason == ("stop" if sequence.token_ids[-1] in STOPS else "length")
            expected = token_logprobs(reference, list(prompt), sequence.token_ids)
            assert sequence.logprobs == pytest.approx(expected, abs=1e-4)
    assert len(lengths) > 2, f"rows should stop at different steps, got lengths {sorted(lengths)}"
