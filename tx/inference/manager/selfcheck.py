"""An engine that does not check itself is checked against the trainer before its base model is sampled: never
a family served silently wrong, and never a list of names deciding it.

The embedded engine checks itself at load (`tx/inference/engines/embedded/selfcheck.py`); the vLLM engine runs
vLLM's own implementation of each family, which can differ from the trainer's (a family vLLM maps to the wrong
architecture, a kernel that breaks on one shape). So before the first sample of a base model on such an
engine (`EngineSettings.self_check`), the manager asks the engine for the prompt logprobs of a few seeded
random prompts and compares them with the trainer's own forward of the same tokens (`BaseLogprobs`, which the
core hands over from the backend, on the training thread), by the largest difference of a token's logprob
(`tx.models.agreement.token_tolerance`: the trainer's float32 bound, 1e-4; 0.25 in 16-bit):

- `alone`: each prompt on its own, one after the other.
- `batched`: the same prompts at once, which the engine batches together.

Where either differs beyond the bound (or the engine's answer fails), every sample of that base model is
refused with a 400 naming the check. Every trainer computes the reference (in process, over worker processes,
JAX); one that could not (`base_logprobs` None) would leave the model unchecked, with a warning. The log says
what each check measured and what was decided.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tx.inference.manager.client import InferenceClient
from tx.types import BaseLogprobs, ModelInput, SampleKey, SampleRequest, SamplingParams

logger = logging.getLogger(__name__)

CHECK_PROMPTS = 3
CHECK_LENGTH = 16
CHECK_SEED = 0
CHECK_ID_RANGE = 8192
"""Prompt ids are drawn below this (or the vocabulary's size): ids a tokenizer knows, as some engines refuse ids
past the tokenizer's last (a model's embedding is often padded past it)."""

Reference = Callable[[str, list[list[int]]], Awaitable[BaseLogprobs | None]]
"""The trainer's base forward of some token sequences of a base model (the core's, over the backend)."""


@dataclass(frozen=True)
class Verdict:
    """What the self-check decided for one base model."""

    refused: str | None = None
    """Why its samples are refused (None: they are served)."""
    measured: dict[str, float] = field(default_factory=dict)


def check_prompts(model_dir: Path) -> list[list[int]]:
    """The check's prompts: seeded random token ids."""
    generator = random.Random(CHECK_SEED)
    top = min(_vocab_size(model_dir), CHECK_ID_RANGE)
    return [[generator.randrange(top) for _ in range(CHECK_LENGTH)] for _ in range(CHECK_PROMPTS)]


def _vocab_size(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {})["vocab_size"])


async def check_engine(client: InferenceClient, engine: str, base_model: str, prompts: list[list[int]],
                       reference: BaseLogprobs) -> Verdict:
    """Compare `engine`'s prompt logprobs of `prompts` with the trainer's, alone and batched."""
    start = time.monotonic()
    measured: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for name, form in (("alone", _alone), ("batched", _batched)):
        seconds[name] = time.monotonic()
        try:
            got = await form(client, engine, prompts)
        except Exception as exc:  # noqa: BLE001  an engine that cannot answer the check fails it
            logger.warning("self-check %s of %s on %s raised %s: %s", name, base_model, engine,
                           type(exc).__name__, exc)
            got = None
        measured[name] = float("inf") if got is None else _difference(got, reference.logprobs)
        seconds[name] = time.monotonic() - seconds[name]
    failed = [name for name, value in measured.items() if not value <= reference.tolerance]
    refused = None
    if failed:
        refused = (f"its prompt logprobs differ from the trainer's forward of the same tokens by "
                   f"{max(measured[n] for n in failed):.3g} (bound {reference.tolerance:g}; engine self-check "
                   f"{' and '.join(repr(n) for n in failed)})")
    shown = ", ".join(f"{name} {value:.2g} in {seconds[name]:.2f} s" for name, value in measured.items())
    logger.info("engine self-check of %s on %s (%s; bound %g) in %.2f s: %s", base_model, engine, shown,
                reference.tolerance, time.monotonic() - start, f"REFUSED: {refused}" if refused else "served")
    return Verdict(refused, measured)


def _difference(got: Sequence[Sequence[float]], want: Sequence[Sequence[float]]) -> float:
    if len(got) != len(want) or any(len(g) != len(w) for g, w in zip(got, want)):
        return float("inf")
    worst = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in zip(got, want))
    return worst if np.isfinite(worst) else float("inf")


def _request(prompt: list[int]) -> SampleRequest:
    return SampleRequest(prompt=ModelInput.from_tokens(prompt), num_samples=1,
                         params=SamplingParams(max_tokens=1, temperature=0.0), prompt_logprobs=True)


async def _one(client: InferenceClient, engine: str, index: int, prompt: list[int]) -> list[float]:
    result = await client.sample(engine, str(SampleKey("tx-self-check", index)), _request(prompt),
                                 None)
    if result.prompt_logprobs is None:
        raise RuntimeError("the engine returned no prompt logprobs")
    return [float(v) for v in result.prompt_logprobs[1:]]


async def _alone(client: InferenceClient, engine: str, prompts: list[list[int]]) -> list[list[float]]:
    return [await _one(client, engine, i, p) for i, p in enumerate(prompts)]


async def _batched(client: InferenceClient, engine: str, prompts: list[list[int]]) -> list[list[float]]:
    return list(await asyncio.gather(*(_one(client, engine, i, p) for i, p in enumerate(prompts))))
