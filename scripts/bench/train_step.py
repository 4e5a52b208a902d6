"""tx training step through the SDK vs the same step in plain torch, side by side in one run.

Prints JSON: median seconds per forward_backward+optim_step step for each, their ratio, the CPU seconds each
step used (tx: the server process plus this client; torch: this process), which a busy machine moves less than
wall time, the load average, and the p50/p90 latency of a trivial call (get_info) over HTTP. The plain loop runs
with the environment `tx serve` gives its trainer (`tx/cpu.py`: huge pages, OpenMP threads that sleep while they
wait), so the ratio is tx's own cost, not a thread-pool setting: with torch's default spinning the plain loop
itself took 4.4 s a step at load 3.8 on a 2-core box, 1.4 s with the waits passive.
On a GPU (`--device cuda --model DIR`, a local Hugging Face model such as Qwen3-0.6B) both run on cuda with
the base in bfloat16 and the LoRA in float32 (tx's default there; PEFT casts the adapter up by itself).
Usage: python scripts/bench/train_step.py [--steps 10] [--batch 8] [--seq-len 128] [--model DIR --device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tx.cpu import use_cpu_defaults

use_cpu_defaults()  # the plain loop runs with the environment `tx serve` gives its trainer (before torch loads)
import httpx  # noqa: E402
import numpy as np  # noqa: E402
import tinker  # noqa: E402
import torch  # noqa: E402
from tinker import types  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import API_KEY, TxServer  # noqa: E402

from tx.models import write_tiny_text_model  # noqa: E402

LR = 1e-4


def make_batch(batch: int, seq_len: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab - 100, size=(batch, seq_len + 1))


def plain_torch_steps(model_dir: Path, tokens: np.ndarray, steps: int, device: str):
    """The reference: the same model, LoRA and loss in one process, no server."""
    import peft
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
    config = peft.LoraConfig(
        r=8, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj", "lm_head"],
    )
    model = peft.get_peft_model(model, config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                                  betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    inputs = torch.tensor(tokens[:, :-1], device=device)
    targets = torch.tensor(tokens[:, 1:], device=device)

    def step() -> float:
        start = time.perf_counter()
        logits = model(input_ids=inputs).logits.float()
        logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        (-logp.sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(steps):
        yield step()


def tx_steps(tc: tinker.TrainingClient, tokens: np.ndarray, steps: int):
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1].tolist()),
            loss_fn_inputs={"target_tokens": row[1:].tolist(), "weights": [1.0] * (len(row) - 1)},
        )
        for row in tokens
    ]
    for _ in range(steps):
        start = time.perf_counter()
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=LR))
        fb.result()
        opt.result()
        yield time.perf_counter() - start


def trivial_call_latency(server: TxServer, model_id: str, calls: int = 200) -> list[float]:
    latencies = []
    with httpx.Client(base_url=server.url, headers={"X-API-Key": API_KEY}) as http:
        for _ in range(calls):
            start = time.perf_counter()
            http.post("/api/v1/get_info", json={"model_id": model_id, "type": "get_info"}).raise_for_status()
            latencies.append(time.perf_counter() - start)
    return latencies


def parameter_count(model_dir: Path) -> int:
    """The parameters in a model directory's safetensors files, read from their headers."""
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            total += sum(int(np.prod(f.get_slice(name).get_shape())) for name in f.keys())
    return total


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--model", type=Path, help="a local Hugging Face model (default: the ~21M `bench` preset)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the plain loop runs")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or write_tiny_text_model(Path(tmp) / "bench-model", preset="bench")
        n_params = parameter_count(model_dir)
        server = TxServer(Path(tmp) / "data", args=["--base-model", str(model_dir)]).start()
        try:
            client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
            tc = client.create_lora_training_client(str(model_dir), rank=8, seed=0).result()
            vocab = json.loads((model_dir / "config.json").read_text()).get("vocab_size", 8000)
            tokens = make_batch(args.batch, args.seq_len, min(8000, vocab))  # the tiny presets' is 2,048
            total = args.warmup + args.steps
            tx_iter, torch_iter = tx_steps(tc, tokens, total), plain_torch_steps(model_dir, tokens, total, args.device)
            tx_times, torch_times, tx_cpu, torch_cpu, loads = [], [], [], [], []
            assert server.proc is not None
            for i in range(total):  # interleaved, so both see the same machine noise
                server_cpu, own_cpu = process_cpu_s(server.proc.pid), time.process_time()
                t_tx = next(tx_iter)
                server_cpu, own_cpu = process_cpu_s(server.proc.pid) - server_cpu, time.process_time() - own_cpu
                before = time.process_time()
                t_torch = next(torch_iter)
                if i >= args.warmup:
                    tx_times.append(t_tx)
                    torch_times.append(t_torch)
                    tx_cpu.append(server_cpu + own_cpu)
                    torch_cpu.append(time.process_time() - before)
                    loads.append(os.getloadavg()[0])
            latencies = trivial_call_latency(server, tc.model_id)
            client.close("success")
        finally:
            server.stop()

    tx_med, torch_med = statistics.median(tx_times), statistics.median(torch_times)
    tx_cpu_med, torch_cpu_med = statistics.median(tx_cpu), statistics.median(torch_cpu)
    q = statistics.quantiles(latencies, n=10)
    print(json.dumps({
        "model_parameters": n_params,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "batch": [args.batch, args.seq_len],
        "lora_rank": 8,
        "steps": args.steps,
        "tx_step_s_median": round(tx_med, 4),
        "torch_step_s_median": round(torch_med, 4),
        "ratio_tx_over_torch": round(tx_med / torch_med, 3),
        "tx_cpu_s_median": round(tx_cpu_med, 4),
        "torch_cpu_s_median": round(torch_cpu_med, 4),
        "cpu_ratio_tx_over_torch": round(tx_cpu_med / torch_cpu_med, 3),
        "load_average_median": round(statistics.median(loads), 2),
        "target_ratio": 1.05,
        "get_info_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "get_info_p90_ms": round(q[8] * 1000, 2),
        "target_trivial_ms": 5.0,
    }, indent=2))


if __name__ == "__main__":
    main()
