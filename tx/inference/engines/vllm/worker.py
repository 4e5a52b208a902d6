"""`TxWorkerExtension`: tx's weight receiver inside every vLLM worker (`--worker-extension-cls`).

Design / who owns what:
- vLLM mixes this class into its worker, so methods see `self.rank`, `self.device`, `self.model_runner`. The
  tx engine process calls them through vLLM's `/collective_rpc` with JSON strings only (nothing is pickled;
  `VLLM_ALLOW_INSECURE_SERIALIZATION` stays off). Names carry a `tx_` prefix so they never shadow the
  worker's own methods; state lives in `_tx_*` attributes.
- `tx_init_transfer` builds tx's `BroadcastReceiver` (rank = `rank_offset + self.rank`; gloo on CPU, NCCL on a
  GPU) and joins the group in a thread, so the call returns at once while the trainer joins from its side.
- `tx_update_base` receives HF-named tensors and applies them with `reload_weights(weights_iterator=...,
  is_checkpoint_format=True)`: it re-runs the loader's post-processing (the CPU backend repacks linear
  weights, so plain `model.load_weights` after startup changes nothing there). `tx_update_lora` receives a
  PEFT adapter's tensors and writes them as a PEFT directory (worker rank 0 only); the engine process then
  loads that directory with `/v1/load_lora_adapter`. `tx_update_ipc` does either from CUDA IPC handles
  (colocated: trainer and engine on one GPU).
- Importing this module (vLLM does, in each worker process) fixes vLLM's CPU LoRA ops so a request without an
  adapter takes none (`cpu_lora.py`).
- Every method returns a JSON-able dict and never raises: an error becomes `{"error", "status"}`, so a bad
  update cannot take vLLM's engine core down. A partial transfer closes the group (it is unusable after one).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tx.inference.engines.vllm.cpu_lora import skip_rows_without_adapter

logger = logging.getLogger(__name__)
skip_rows_without_adapter()  # vLLM imports this module in each worker process (cpu_lora.py says why)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class _Failure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class TxWorkerExtension:
    """Methods vLLM adds to its worker class; see the module docstring."""

    if TYPE_CHECKING:  # what the vLLM worker this class is mixed into provides
        rank: int
        device: torch.device

        def reload_weights(self, *args: Any, **kwargs: Any) -> None: ...

    # ---- the transfer group

    def tx_init_transfer(self, init_json: str) -> dict:
        from tx.inference.weight_sync import BroadcastReceiver, TransferInit

        return self._tx_call(
            lambda: self._tx_init(BroadcastReceiver, TransferInit.model_validate_json(init_json))
        )

    def _tx_init(self, receiver_cls, init) -> dict:
        self._tx_close()
        rank = init.rank_offset + self.rank
        device = self.device if init.backend == "nccl" else torch.device("cpu")
        state = {
            "receiver": receiver_cls(init, rank=rank, device=device),
            "state": "connecting",
            "error": None,
        }
        state["thread"] = threading.Thread(
            target=_connect, args=(state,), name="tx-weights-join", daemon=True
        )
        state["init"] = init
        self._tx_transfer = state
        state["thread"].start()
        return {"state": "connecting", "rank": rank}

    def tx_transfer_state(self) -> dict:
        state = getattr(self, "_tx_transfer", None)
        if state is None:
            return {"state": "none"}
        return {"state": state["state"], "error": None if state["error"] is None else repr(state["error"])}

    def tx_close_transfer(self) -> dict:
        return self._tx_call(lambda: self._tx_close() or {"state": "none"})

    def _tx_close(self) -> None:
        state = getattr(self, "_tx_transfer", None)
        self._tx_transfer = None
        if state is not None:
            try:
                state["receiver"].close()
            except Exception:
                logger.exception("closing the weight transfer group failed")

    def _tx_receiver(self):
        state = getattr(self, "_tx_transfer", None)
        if state is None:
            raise _Failure(409, "no weight transfer group: POST /weights/init first")
        state["thread"].join(timeout=state["init"].timeout_s)
        if state["state"] != "ready":
            raise _Failure(409, f"the weight transfer group is {state['state']}: {state['error']!r}")
        return state["receiver"]

    # ---- updates

    def tx_update_base(self, update_json: str) -> dict:
        """Receive full or partial base weights (HF checkpoint names) and load them."""
        from tx.inference.weight_sync import TransferUpdate

        def run() -> dict:
            update = TransferUpdate.model_validate_json(update_json)
            return self._tx_received(update, lambda named: self._tx_load_base(named))

        return self._tx_call(run)

    def tx_update_lora(self, update_json: str, lora_json: str, path: str, base_model: str) -> dict:
        """Receive a PEFT adapter's tensors and write them as a PEFT directory at `path` (rank 0)."""
        from tx.inference.weight_sync import TransferUpdate

        def run() -> dict:
            update = TransferUpdate.model_validate_json(update_json)
            lora = json.loads(lora_json)
            return self._tx_received(
                update, lambda named: self._tx_write_adapter(named, lora, path, base_model)
            )

        return self._tx_call(run)

    def tx_update_ipc(self, ipc_json: str, lora_json: str = "", path: str = "", base_model: str = "") -> dict:
        """The same from CUDA IPC handles (`tx.inference.weight_sync.IpcUpdate`): base weights when
        `lora_json` is empty, else an adapter written to `path`."""
        from tx.inference.weight_sync import IpcReceiver, IpcUpdate

        def run() -> dict:
            update = IpcUpdate.model_validate_json(ipc_json)
            start = time.perf_counter()
            named = _Counted(IpcReceiver(self.device).receive(update))
            if lora_json:
                self._tx_write_adapter(named, json.loads(lora_json), path, base_model)
            else:
                self._tx_load_base(named)
            return named.summary(start)

        return self._tx_call(run)

    def tx_reload_base(self, model_dir: str) -> dict:
        """Reload the base weights from `model_dir` (after a level-2 sleep dropped them)."""
        return self._tx_call(lambda: self.reload_weights(weights_path=model_dir) or {"reloaded": model_dir})

    def _tx_received(self, update, apply) -> dict:
        receiver = self._tx_receiver()
        start = time.perf_counter()
        named = _Counted(receiver.receive(update))
        try:
            apply(named)
            named.drain()  # the sender waits for every bucket
        except BaseException:
            self._tx_close()  # a partial transfer leaves the group unusable
            raise
        return named.summary(start)

    def _tx_load_base(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)

    def _tx_write_adapter(
        self, named: Iterable[tuple[str, torch.Tensor]], lora: dict, path: str, base_model: str
    ) -> None:
        from safetensors.torch import save_file

        tensors = {_peft_name(name): tensor.detach().to("cpu").contiguous() for name, tensor in named}
        if self.rank != 0:
            return
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700, parents=False)
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(_adapter_config(lora, base_model)))
        os.replace(tmp, target)

    # ---- errors

    def _tx_call(self, run) -> dict:
        try:
            return run()
        except _Failure as exc:
            return {"error": str(exc), "status": exc.status}
        except (ValueError, KeyError) as exc:
            logger.exception("tx worker call failed")
            return {"error": f"{type(exc).__name__}: {exc}", "status": 400}
        except Exception as exc:
            logger.exception("tx worker call failed")
            return {"error": f"{type(exc).__name__}: {exc}", "status": 500}


def _connect(state: dict) -> None:
    try:
        state["receiver"].connect()
        state["state"] = "ready"
    except BaseException as exc:  # reported on the next update and by tx_transfer_state
        logger.exception("joining the weight transfer group failed")
        state["error"], state["state"] = exc, "failed"


class _Counted:
    """Iterates the received (name, tensor) pairs once, counting them; `drain` consumes what is left."""

    def __init__(self, pairs: Iterator[tuple[str, torch.Tensor]]) -> None:
        self._pairs = pairs
        self.num_tensors = 0
        self.num_bytes = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._pairs:
            self.num_tensors += 1
            self.num_bytes += tensor.numel() * tensor.element_size()
            yield name, tensor

    def drain(self) -> None:
        for _ in self:
            pass

    def summary(self, start: float) -> dict:
        return {
            "num_tensors": self.num_tensors,
            "num_bytes": self.num_bytes,
            "seconds": time.perf_counter() - start,
        }


def _peft_name(name: str) -> str:
    """vLLM reads PEFT state-dict names (`base_model.model.<module>.lora_A.weight`)."""
    return name if name.startswith("base_model.model.") else "base_model.model." + name


def _adapter_config(lora: dict, base_model: str) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora["r"],
        "lora_alpha": lora["lora_alpha"],
        "target_modules": list(lora["target_modules"]),
        "target_parameters": list(lora.get("target_parameters") or []) or None,
        "exclude_modules": list(lora.get("exclude_modules") or []) or None,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
