"""Pushing weights into a live engine from a test: a gloo group with the engine, one push, a random adapter.

`engine` is any test handle with `post(path, body) -> dict` (the embedded and vLLM engine helpers).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from tx.inference.weight_sync import BroadcastSender, TransferInit, free_port, plan_update


def gloo_sender(engine, timeout_s: float = 60) -> Iterator[BroadcastSender]:
    """A transfer group between this process (rank 0) and the engine (rank 1); a generator for fixtures."""
    init = TransferInit(
        backend="gloo", master_address="127.0.0.1", master_port=free_port(), world_size=2, rank_offset=1,
        group_name=f"test-{uuid.uuid4().hex}", timeout_s=timeout_s,
    )
    assert engine.post("/weights/init", init.model_dump())["weight_transfer"] in ("connecting", "ready")
    sender = BroadcastSender(init)
    sender.connect()
    yield sender
    sender.close()


def push(engine, sender: BroadcastSender, named, adapter=None, lora=None, timeout_s: float = 120) -> dict:
    """One `POST /weights/update` answered while `sender` broadcasts `named` (small buckets: many of them)."""
    update = plan_update(named, bucket_bytes=1 << 16)
    body = {"transfer": update.model_dump(), "adapter": adapter, "lora": lora}
    with ThreadPoolExecutor(1) as pool:
        response = pool.submit(engine.post, "/weights/update", body)
        sender.send(named, update)
        return response.result(timeout=timeout_s)


def perturbed(reference, seed: int, scale: float = 0.05):
    """A copy of `reference` with every weight moved by `scale` * seeded N(0, 1) noise: new full weights."""
    model = copy.deepcopy(reference)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return model


def random_adapter(reference, seed: int, r: int, lora_alpha: float, targets: list[str]):
    """A PEFT LoRA model on a copy of `reference` with random non-zero A and B, and its tensors (cpu)."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    config = LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=targets, lora_dropout=0.0)
    model = get_peft_model(copy.deepcopy(reference), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    model.eval()
    state = get_peft_model_state_dict(model, save_embedding_layers=False)  # LoRA tensors only, as tx pushes
    named = [(name, t.detach().contiguous()) for name, t in state.items()]
    return model, named


def assert_update_reaches_a_running_request(engine, sender, reference, lora: dict, targets: list[str],
                                            prompt: list[int], max_tokens: int = 384, tries: int = 3) -> None:
    """An adapter updated in place (the same name pushed again) while a long greedy request generates with it:
    the request is not aborted (it runs to max_tokens), starts as the old weights' greedy sequence and ends
    otherwise; requests after the update run on the new weights.

    The engine is paused (mode "keep") while the update lands. A request that is wholly the old weights' or
    the new weights' sequence proves nothing: on a loaded machine it may have ended before the pause or not
    have begun. It is run again, twice as long, up to `tries` times.
    The adapters "live" and "fresh" are deleted whatever happens."""
    _, old = random_adapter(reference, 11, r=lora["r"], lora_alpha=lora["lora_alpha"], targets=targets)
    _, new = random_adapter(reference, 12, r=lora["r"], lora_alpha=lora["lora_alpha"], targets=targets)
    try:
        push(engine, sender, new, adapter="fresh", lora=lora)
        for attempt in range(tries):
            if _update_lands_in_a_running_request(engine, sender, old, new, lora, prompt, max_tokens << attempt):
                return
        raise AssertionError(f"no request of {tries} (up to {max_tokens << (tries - 1)} tokens) took the update "
                             "midway: each was wholly the old weights' or the new weights' sequence")
    finally:
        for name in ("live", "fresh"):
            if name in engine.health()["adapters"]:
                engine.http.delete(f"/adapters/{name}")


def _update_lands_in_a_running_request(engine, sender, old, new, lora: dict, prompt: list[int],
                                       max_tokens: int) -> bool:
    """One try of `assert_update_reaches_a_running_request`; False when it proves nothing."""
    push(engine, sender, old, adapter="live", lora=lora)
    body = dict(prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0.0, stop_at_eos=False)
    before = engine.generate(**body, adapter="live")["sequences"][0]["token_ids"]
    after = engine.generate(**body, adapter="fresh")["sequences"][0]["token_ids"]
    assert before != after
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(engine.generate, **body, adapter="live")
        deadline = time.monotonic() + 30
        while engine.health()["num_running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # num_running counts from the engine server's side: let the request reach the model
        engine.post("/pause", {"mode": "keep"})  # the request holds still while the update lands, as in training
        try:
            time.sleep(1)  # as a training pass would: the engine settles into the pause
            push(engine, sender, new, adapter="live", lora=lora)
        finally:
            engine.post("/resume")
        (seq,) = running.result(timeout=120)["sequences"]
    assert seq["stop_reason"] == "length" and len(seq["token_ids"]) == max_tokens, seq["stop_reason"]
    tokens = seq["token_ids"]
    if tokens in (before, after):
        return False
    assert tokens[:1] == before[:1], "began on the old weights, then took the new ones"
    assert engine.generate(**body, adapter="live")["sequences"][0]["token_ids"] == after
    return True
