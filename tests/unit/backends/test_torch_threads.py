"""The trainer takes its share of the CPU threads on the training thread: every call is given the number the
budget gives at that moment (`tx/cpu.py`), asked before the call (the real TorchBackend, the core's scheduler
and services over a SQLite store; no server), and a call too small to split runs on one of them."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import torch
from backend_helpers import TINY_NAME, ce, sft_data

from tx.backends.torch.backend import TorchBackend
from tx.backends.torch.model import training_flops_per_token
from tx.core.checkpoints.downloads import DownloadSigner
from tx.core.checkpoints.files import CheckpointFiles
from tx.core.futures import FutureRegistry
from tx.core.scheduler import Scheduler
from tx.core.services import build_services
from tx.cpu import SMALL_PASS_FLOPS
from tx.optimizers import AdamParams, OptimParams
from tx.store.store import Store
from tx.types import ForwardBackwardInput, ForwardBackwardResult, LoraConfig, OptimStepResult

OWNER = "owner"


class ThreadsSeen(TorchBackend):
    """The torch trainer, noting the intra-op threads each pass ran with."""

    seen: list[int]

    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        self.seen.append(torch.get_num_threads())
        return super().forward_backward(model_id, batch)

    def optim_step(self, model_id: str, params: OptimParams) -> OptimStepResult:
        self.seen.append(torch.get_num_threads())
        return super().optim_step(model_id, params)


def test_each_pass_runs_with_the_share_of_the_moment(tiny_model_dir: Path, tmp_path: Path) -> None:
    backend = ThreadsSeen({TINY_NAME: tiny_model_dir}, device="cpu")
    backend.seen = []
    shares = iter([2, 2, 1, 1])  # say an engine starts after the first step

    async def main() -> None:
        store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
        futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=3600)
        scheduler = Scheduler(futures, 30)
        core = build_services(store, backend, futures, scheduler, CheckpointFiles(tmp_path / "ck"),
                              DownloadSigner(b"k" * 32, 3600), trainer_threads=lambda: next(shares))
        scheduler.start()
        try:
            session = core.sessions.create(OWNER, None, [], {})
            created = core.runs.create(OWNER, session, 0, TINY_NAME, LoraConfig(rank=4, seed=0), None)
            model_id = (await futures.wait(created.request_id, OWNER, 60)).result.model_id
            calls = [core.training.forward_backward(OWNER, model_id, 1, ce(sft_data())),
                     core.training.optim_step(OWNER, model_id, 2, AdamParams()),
                     core.training.forward_backward(OWNER, model_id, 3, ce(sft_data())),
                     core.training.optim_step(OWNER, model_id, 4, AdamParams())]
            for call in calls:
                done = await futures.wait(call.request_id, OWNER, 60)
                assert done.done and done.failure is None, done.failure
        finally:
            scheduler.stop(5)
            store.close()

    mine = torch.get_num_threads()
    asyncio.run(main())
    assert backend.seen == [2, 2, 1, 1]
    assert torch.get_num_threads() == mine  # set on the training thread only


def test_a_call_too_small_to_split_runs_on_one_thread(tiny_model_dir: Path, monkeypatch) -> None:
    """A pass under `SMALL_PASS_FLOPS` (tokens x `training_flops_per_token`) and a LoRA run's optimizer step run
    on one thread, a larger pass on the trainer's share; the share itself is kept for the next call."""
    import tx.backends.torch.backend as torch_backend

    backend = TorchBackend({TINY_NAME: tiny_model_dir}, device="cpu")
    backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
    seen: list[int] = []
    for name in ("run_calls", "optimizer_step"):
        real = getattr(torch_backend, name)
        monkeypatch.setattr(torch_backend, name,
                            lambda *a, real=real, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    per_token = training_flops_per_token(backend._hosts[TINY_NAME].model)
    length = 64
    large = math.ceil(SMALL_PASS_FLOPS / per_token / (length - 1)) + 1  # datums of 63 tokens over the line
    mine = torch.get_num_threads()
    try:
        backend.use_threads(2)
        backend.forward_backward("m", ce(sft_data(count=2, length=length)))
        backend.optim_step("m", AdamParams())
        backend.forward_backward("m", ce(sft_data(count=large, length=length)))
    finally:
        torch.set_num_threads(mine)
    assert 2 * (length - 1) * per_token < SMALL_PASS_FLOPS <= large * (length - 1) * per_token
    assert seen == [1, 1, 2]


def test_training_flops_count_each_weight_a_token_touches(tiny_model_dir: Path) -> None:
    """6 operations (forward and backward) per weight but the input embeddings'; a head tied to them counts."""
    import transformers

    for tied in (True, False):
        config = transformers.AutoConfig.from_pretrained(tiny_model_dir, tie_word_embeddings=tied)
        model = transformers.Qwen3ForCausalLM(config)
        embedding = model.get_input_embeddings().weight.numel()
        body = sum(p.numel() for p in model.model.parameters()) - embedding
        assert training_flops_per_token(model) == 6 * (body + model.lm_head.weight.numel())
