"""The engine's weights: the base model, its LoRA adapters, sleep and wake.

Design / who owns what:
- `Weights` owns the one model (a transformers causal LM, base weights in the engine's dtype, the trainer's
  choice of attention, on `device`: the cpu or one GPU) and, once an adapter arrives, the PEFT `PeftModel`
  wrapped around it: several LoRA adapters (float32 on any base) live on one base model; `use` sets the model up
  for a forward whose rows use one adapter (`activate`: that one, or none for the base) or several
  (`mixing.py`).
- Every use or change of the model happens under `lock` (an RLock): the scheduler holds it for one forward,
  weight updates for one tensor or one adapter, sleep for the whole offload.
- Sleep level 1 stashes every parameter (adapters included) to a private safetensors file (`stash.py`) and
  frees it from RAM (or GPU memory); level 2 drops the whole model (adapters too) and wake reloads the base from
  `model_dir`. On a GPU, sleep also empties torch's caching allocator, so the memory goes back to the device.
- Receiving weight updates over a collective lives in `transfer.py`; it calls `load_adapter` and `copy_base`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard, cast

import torch

from tx.config.names import AttnImplementation
from tx.devices import resolve_device
from tx.inference.engines.embedded.attention import engine_attention, family_attention
from tx.inference.engines.embedded.lean_decode import Plan, plan, supports
from tx.inference.engines.embedded.mixing import BASE, AdapterMixer
from tx.inference.engines.embedded.prebuilt import take_tokenizer
from tx.inference.engines.embedded.selfcheck import ServingPlan
from tx.inference.engines.embedded.selfcheck_cache import checked_serving
from tx.inference.engines.embedded.stash import release_memory, restore_parameters, stash_parameters
from tx.inference.protocol import LoraSpec, WakeTag
from tx.models.auto import load_frozen
from tx.models.lora_targets import LoraTargets, exact_targets, peft_config
from tx.multimodal.audio import check_frames_apart
from tx.multimodal.placeholders import placeholder_ids
from tx.types import ConflictError, NotFoundError, UserError

if TYPE_CHECKING:
    from peft import LoraModel, PeftModel
    from transformers import PreTrainedModel

    ServedModel = PreTrainedModel | PeftModel  # the base alone, or PEFT's wrapper once an adapter arrived

logger = logging.getLogger(__name__)

_UNSET = object()
ALL_TAGS: tuple[WakeTag, ...] = ("weights", "kv_cache")


def _eos_ids(model: PreTrainedModel) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


class Weights:
    """The model and adapters one engine serves, and their sleep state."""

    def __init__(
        self, model_dir: Path, max_adapters: int, stash_dir: Path | None = None, device: str = "cpu",
        dtype: str = "float32", attention: AttnImplementation | None = None,
    ) -> None:
        """`dtype`: the base weights' ("bfloat16", ...), as the trainer's; LoRA adapters are float32 on any
        base (PEFT's adapter autocast, as in the trainer); logits are cast to float32 before log_softmax.
        `attention`: forced; None chooses as the trainer does (`tx/models/attention.py`)."""
        self.model_dir = Path(model_dir)
        self.dtype: torch.dtype = getattr(torch, dtype)
        self.max_adapters = max_adapters
        self.stash_dir = stash_dir
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # this thread's; the scheduler loop runs on it in the engine
        self.lock = threading.RLock()
        self.family_attention = family_attention(self.model_dir, self.device, self.dtype, attention)
        base = self._load(engine_attention(self.family_attention))
        self.model: ServedModel | None = base  # None after a level 2 sleep
        logger.info("model %s loaded on %s (%s)", self.model_dir, self.device, self.dtype)
        self.tokenizer = take_tokenizer(self.model_dir)
        config = base.config.get_text_config()  # a vision-language model's language part
        self.vocab_size: int = config.vocab_size
        self.max_positions: int = getattr(config, "max_position_embeddings", 1 << 30)
        self.eos_ids = _eos_ids(base)
        self.never_sampled = placeholder_ids(base.config.to_dict())  # a VLM's: never drawn (generate.py)
        check_frames_apart(base, self.model_dir)  # audio goes frame by frame (`tx.multimodal.audio`)
        pad = getattr(config, "pad_token_id", None)
        pad = pad if pad is not None else (self.eos_ids or (0,))[0]
        self.pad_id: int = int(pad)
        self.adapters: dict[str, str | None] = {}
        self.lora_specs: dict[str, LoraSpec] = {}
        self._peft_names: dict[str, str] = {}  # adapter name -> PEFT's (names with dots would break modules)
        self._num_created = 0
        self.base_version: str | None = None
        self.asleep: set[WakeTag] = set()
        self.sleep_level = 0
        self._stash: Path | None = None
        self._active: object = _UNSET
        self._mixer = AdapterMixer()
        self._lean: tuple[object, Plan | None] = (None, None)
        with torch.inference_mode():
            self.serving: ServingPlan = checked_serving(base, self.model_dir, self.pad_id, self.family_attention,
                                                        self.lean_plan)

    # ---- serving

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:  # the engine refuses stop strings (the only decoding) without one
            raise UserError("stop strings need a tokenizer, and this model directory has none")
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        assert isinstance(text, str)  # one sequence's ids decode to one string
        return text

    def has_adapter(self, name: str) -> bool:
        return name in self.adapters

    def activate(self, adapter: str | None) -> ServedModel:
        """Make the next forward use `adapter` (None = the base model); the model to run it. Call under
        `lock`."""
        if adapter is not None and adapter not in self.adapters:
            raise NotFoundError(f"adapter {adapter!r} is not loaded")
        if self.model is None or "weights" in self.asleep:
            raise ConflictError("the weights are asleep")
        model = self.model
        if adapter == self._active:
            return model
        if _is_peft(model):
            if adapter is None:
                _lora_tuner(model).disable_adapter_layers()
            else:
                _lora_tuner(model).enable_adapter_layers()
                model.set_adapter(self._peft_names[adapter])
        self._active = adapter
        return model

    def lean_plan(self, model: ServedModel) -> Plan | None:
        """The lean decode step (`lean_decode.py`) for rows of the adapter `use` just activated on `model`, or
        None where transformers' forward must run (resolved once per model, LoRA layers and active adapter)."""
        key = (id(model), self._mixer.generation, self._active)
        if self._lean[0] != key:
            self._lean = (key, plan(model) if supports(model) else None)
        return self._lean[1]

    def _forget_active(self) -> None:
        """The model or its adapters changed: the next `activate` sets the adapter again, and the lean plan
        (which holds the model's tensors) is resolved again."""
        self._active = _UNSET
        self._lean = (None, None)

    @property
    def mixable(self) -> bool:
        """Whether rows of different adapters may share a forward (`use`)."""
        return self._mixer.mixable

    def use(self, adapters: Sequence[str | None]) -> ServedModel:
        """The model for one forward whose row i uses `adapters[i]` (None: the base); call under `lock`. Rows of
        one adapter run as `activate` sets it; rows of several share the forward (`mixing.py`)."""
        if len(set(adapters)) == 1:
            self._mixer.set(None)
            return self.activate(adapters[0])
        missing = [a for a in adapters if a is not None and a not in self.adapters]
        if missing:
            raise NotFoundError(f"adapter {missing[0]!r} is not loaded")
        model = self.activate(next(a for a in adapters if a is not None))  # adapter layers on
        self._mixer.set([self._peft_names[a] if a is not None else BASE for a in adapters])
        return model

    # ---- adapters

    def load_adapter(self, name: str, spec: LoraSpec, tensors: dict[str, torch.Tensor]) -> None:
        """Create (or re-create, if its config changed) adapter `name` and set its LoRA tensors. An adapter it holds
        with the same config is updated in place: its parameters are copied over under the lock, between two
        decode steps, and requests generating with it go on with the new weights. A load that fails midway (a
        tensor of the wrong shape) unloads the adapter and raises: no request samples half-loaded weights, and
        requests generating with it end with stop reason abort (`Scheduler`)."""
        from peft import set_peft_model_state_dict

        with self.lock:
            model = self._awake_model()
            if self.lora_specs.get(name) == spec and self._copy_in_place(model, name, tensors):
                return
            try:
                if self.lora_specs.get(name) != spec:
                    model = self._create_adapter(name, spec)
                state = {_peft_name(key): value for key, value in tensors.items()}
                with exact_targets():
                    result = set_peft_model_state_dict(model, state, adapter_name=self._peft_names[name])
                unexpected = list(getattr(result, "unexpected_keys", []) or [])
                if unexpected:
                    raise UserError(f"unexpected LoRA tensors for adapter {name!r}: {unexpected[:5]}")
            except Exception:  # half-loaded (or half-replaced): unloaded, so no request samples it
                if name in self.adapters:
                    self._delete(name)
                raise
            self._forget_active()

    def _copy_in_place(self, model: ServedModel, name: str, tensors: dict[str, torch.Tensor]) -> bool:
        """Copy `tensors` into adapter `name`'s parameters (PEFT names them `...lora_A.<its name>.weight`); False,
        touching nothing, unless every tensor has its parameter, of its shape. The lock is held meanwhile (no decode
        step runs): a plain copy holds it for less than PEFT's loader would (rank 32 on the 21M-parameter bench
        model: ~10 ms of CPU against ~24 ms; scripts/bench/inflight_stall.py)."""
        peft_name = self._peft_names[name]
        params = dict(model.named_parameters())
        targets = []
        for key, value in tensors.items():
            param = params.get(re.sub(r"\.(lora_[AB])\.", rf".\1.{peft_name}.", _peft_name(key)))
            if param is None or param.shape != value.shape:
                return False
            targets.append((param, value))
        with torch.no_grad():
            for param, value in targets:
                param.copy_(value)
        return True

    def _create_adapter(self, name: str, spec: LoraSpec) -> PeftModel:
        """Adapter `name` added (PEFT's wrapper made around the base at the first); the wrapped model."""
        from peft import get_peft_model

        if name in self.adapters:
            self._delete(name)
        if len(self.adapters) >= self.max_adapters:
            raise ConflictError(f"{len(self.adapters)} adapters loaded, max_adapters is {self.max_adapters}")
        targets = LoraTargets(tuple(spec.target_modules), tuple(spec.target_parameters), tuple(spec.exclude_modules))
        config = peft_config(targets, spec.r, spec.lora_alpha)
        peft_name = f"adapter_{self._num_created}"
        self._num_created += 1
        model = self._awake_model()
        with exact_targets():
            if _is_peft(model):
                model.add_adapter(peft_name, config)
            else:
                model = get_peft_model(model, config, adapter_name=peft_name)
        model.requires_grad_(False)
        self._mixer.install(model)
        self.model = model
        self.adapters[name] = None
        self.lora_specs[name] = spec
        self._peft_names[name] = peft_name
        self._forget_active()
        return model

    def delete_adapter(self, name: str) -> None:
        with self.lock:
            if name not in self.adapters:
                raise NotFoundError(f"adapter {name!r} is not loaded")
            self._delete(name)

    def _delete(self, name: str) -> None:
        del self.adapters[name], self.lora_specs[name]
        peft_name = self._peft_names.pop(name)
        if self.model is not None:
            assert _is_peft(self.model), "an adapter is loaded, so PEFT wraps the model"
            self.model.delete_adapter(peft_name)
            if not self.adapters:  # back to the plain model: no LoRA wrappers left in the forward
                self.model = cast("PreTrainedModel", _lora_tuner(self.model).unload())  # the base it wrapped
            self._mixer.install(self.model)
        self._forget_active()

    def set_version(self, version: str, adapter: str | None) -> None:
        with self.lock:
            if adapter is None:
                self.base_version = version
            elif adapter in self.adapters:
                self.adapters[adapter] = version
            else:
                raise NotFoundError(f"adapter {adapter!r} is not loaded")

    # ---- base weights

    def base_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The base model's parameters by their HF checkpoint names (ties listed under every name)."""
        with self.lock:
            model = self._awake_model()
            base: torch.nn.Module = _lora_tuner(model).model if _is_peft(model) else model
            return {
                name.replace(".base_layer.", "."): param
                for name, param in base.named_parameters(remove_duplicate=False)
                if ".lora_" not in name
            }

    def copy_base(self, param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        with self.lock:
            self._awake_model()
            param.data.copy_(tensor)

    # ---- sleep and wake

    def sleep(self, level: int) -> None:
        with self.lock:
            if "weights" not in self.asleep:
                self._stash_weights() if level == 1 else self._drop_weights()
                self.sleep_level = level
            self.asleep = set(ALL_TAGS)
            release_memory()

    def wake(self, tags: Iterable[WakeTag] | None) -> None:
        tags = set(tags or ALL_TAGS)
        with self.lock:
            if "weights" in tags and "weights" in self.asleep:
                self._restore_stash() if self.sleep_level == 1 else self._reload()
            self.asleep -= tags
            if not self.asleep:
                self.sleep_level = 0

    def _stash_weights(self) -> None:
        self._stash = stash_parameters(self._awake_model(), self.stash_dir)

    def _restore_stash(self) -> None:
        assert self._stash is not None and self.model is not None, "a level 1 sleep keeps the model"
        restore_parameters(self.model, self._stash)
        self._stash = None

    def _drop_weights(self) -> None:
        self.model = None
        self.adapters.clear()
        self.lora_specs.clear()
        self._peft_names.clear()
        self.base_version = None
        self._forget_active()

    def _load(self, attention: str) -> PreTrainedModel:
        """The base model: frozen, with `attention`, in private memory on cpu."""
        logger.info("attention: %s", attention)
        return load_frozen(self.model_dir, self.device, self.dtype, attention, private_copy=True)

    def _reload(self) -> None:
        self.model = self._load(self.serving.attention)  # as the self-check chose
        self._forget_active()

    def _awake_model(self) -> ServedModel:
        if self.model is None or "weights" in self.asleep:
            raise ConflictError("the weights are asleep; wake_up(['weights']) first")
        return self.model

    def close(self) -> None:
        if self._stash is not None:
            self._stash.unlink(missing_ok=True)


def _is_peft(model: torch.nn.Module) -> TypeGuard[PeftModel]:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _lora_tuner(model: PeftModel) -> LoraModel:
    return cast("LoraModel", model.base_model)  # every adapter here is a LoRA: PEFT's tuner is a LoraModel


def _peft_name(name: str) -> str:
    """PEFT state-dict names start with `base_model.model.`; accept them with or without that prefix."""
    return name if name.startswith("base_model.model.") else "base_model.model." + name
