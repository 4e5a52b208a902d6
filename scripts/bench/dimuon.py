"""What a Dimuon step costs against an AdamW step, on the LoRA matrices of a real model size.

The run's LoRA parameters are built with the shapes of Qwen3-8B (hidden 4,096, MLP 12,288, 8 KV heads of 128, 36
layers; LoRA on q, k, v, o, gate, up and down) at `--rank` (32), with random gradients, and both optimizers take
steps through the trainer's own `optimizer_step` (global grad-norm clipping included), alternating, on `--device`.
Prints JSON: milliseconds per step (median of `--repeats`), Dimuon over AdamW, parameters, optimizer state bytes.

    python scripts/bench/dimuon.py [--layers 36] [--rank 32] [--device cpu|cuda] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tx.backends.torch.optim import new_optimizer, optimizer_step
from tx.optimizers import ADAMW, DIMUON, AdamParams, DimuonParams

HIDDEN, MLP, KV = 4096, 12288, 8 * 128  # Qwen3-8B
PROJECTIONS = {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, KV), "v": (HIDDEN, KV), "o": (HIDDEN, HIDDEN),
               "gate": (HIDDEN, MLP), "up": (HIDDEN, MLP), "down": (MLP, HIDDEN)}


def lora_params(layers: int, rank: int, device: torch.device) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(parameter, its gradient) for lora_A (rank x in) and lora_B (out x rank) of every projection."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(layers):
        for d_in, d_out in PROJECTIONS.values():
            for shape in ((rank, d_in), (d_out, rank)):
                param = torch.nn.Parameter(torch.randn(shape, generator=gen).to(device) * 0.01)
                out.append((param, torch.randn(shape, generator=gen).to(device) * 1e-3))
    return out


def time_steps(params, optimizer, step_params, repeats: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) per step, medians."""
    times, cpu = [], []
    for _ in range(repeats + 1):  # the first builds the state
        for param, grad in params:
            param.grad = grad
        if device.type == "cuda":
            torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        optimizer_step(optimizer, step_params)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(times[1:]), statistics.median(cpu[1:])


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    adam_params, dimuon_params = lora_params(args.layers, args.rank, device), lora_params(args.layers, args.rank, device)
    adamw = new_optimizer([p for p, _ in adam_params], ADAMW)
    dimuon = new_optimizer([p for p, _ in dimuon_params], DIMUON)
    adam_runs, dimuon_runs = [], []
    for _ in range(2):  # alternate, so that load on the machine falls on both
        adam_runs.append(time_steps(adam_params, adamw, AdamParams(learning_rate=1e-4, grad_clip_norm=1.0),
                                    args.repeats, device))
        dimuon_runs.append(time_steps(dimuon_params, dimuon, DimuonParams(learning_rate=0.02, grad_clip_norm=1.0),
                                      args.repeats, device))
    adam_ms, adam_cpu_ms = (1000 * min(values) for values in zip(*adam_runs, strict=True))
    dimuon_ms, dimuon_cpu_ms = (1000 * min(values) for values in zip(*dimuon_runs, strict=True))
    print(json.dumps({
        "shapes": f"Qwen3-8B LoRA (hidden {HIDDEN}, mlp {MLP}), {args.layers} layers, rank {args.rank}",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "lora_parameters": sum(p.numel() for p, _ in adam_params),
        "adamw_ms_per_step": round(adam_ms, 2),
        "dimuon_ms_per_step": round(dimuon_ms, 2),
        "dimuon_over_adamw": round(dimuon_ms / adam_ms, 2),
        "adamw_cpu_ms_per_step": round(adam_cpu_ms, 2),
        "dimuon_cpu_ms_per_step": round(dimuon_cpu_ms, 2),
        "dimuon_over_adamw_cpu": round(dimuon_cpu_ms / adam_cpu_ms, 2),
        "adamw_state_bytes": state_bytes(adamw),
        "dimuon_state_bytes": state_bytes(dimuon),
    }, indent=2))


if __name__ == "__main__":
    main()
