"""Prompt logprobs from plain vLLM, as a user runs it on the files tx exports: `LLM(base, enable_lora=True)` and a
`LoRARequest` on the downloaded adapter directory (what `vllm serve --enable-lora --lora-modules` does). None of
tx's engine code is used. Run in the vLLM environment's Python:

    python plain_vllm.py '[{"model": DIR, "adapters": [DIR, ...], "tokens": [...], "rank": R}, ...]'

One vLLM after another in this process (importing vLLM is most of a start's cost on CPU), each adapter of a model
loaded in turn by its one vLLM. It prints a JSON line per model as it ends, then exits: {"base": [...],
"adapters": [...]}, the logprob of each token after the first without an adapter, then with each: a list, or
{"error": "..."} where vLLM refused that adapter (its engine is then dead: the adapters after it are not tried).
"""

from __future__ import annotations

import json
import sys


def prompt_logprobs(output) -> list[float]:
    tokens = output.prompt_token_ids
    return [row[token].logprob for token, row in zip(tokens[1:], output.prompt_logprobs[1:], strict=True)]


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    llm = LLM(model=job["model"], enable_lora=True, max_lora_rank=job["rank"], max_loras=1, dtype="float32",
              skip_tokenizer_init=True, max_model_len=256, enforce_eager=True, max_logprobs=-1)
    prompt = TokensPrompt(prompt_token_ids=job["tokens"])
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    base = prompt_logprobs(llm.generate(prompt, params, use_tqdm=False)[0])
    adapters: list = []
    try:
        for number, adapter in enumerate(job["adapters"], start=1):
            request = LoRARequest(f"export-{number}", number, adapter)
            adapters.append(prompt_logprobs(llm.generate(prompt, params, use_tqdm=False, lora_request=request)[0]))
    except Exception as exc:  # noqa: BLE001 (vLLM's refusal is the finding)
        adapters.append({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        llm.llm_engine.engine_core.shutdown()
    return {"base": base, "adapters": adapters}


if __name__ == "__main__":
    for job in json.loads(sys.argv[1]):
        print(json.dumps(run(job)), flush=True)
