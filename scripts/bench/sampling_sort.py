"""Benchmark: the embedded engine's draw, at the tiny vocabulary and at Qwen3's.

Per call, on the cpu (where sampling happens), 1 torch thread, for 8 and 64 rows of 2,048 and 151,936 logits:
- `sort`: `torch.sort` of values and ids (before) against `sorting.sorted_descending` + `sorting.ids_at`
  (values sorted by numpy, the id looked up at the drawn position only); both give the same ids (checked);
- `routes`: one step's draw (`generate.sample_next`, the logprobs included) with every row through the sorted
  route (what every row took before) against each row's own route: temperature alone (the SDK's default) over
  the unsorted distribution, top-k 50 over a partial selection. Prints JSON.

    python scripts/bench/sampling_sort.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import torch

from tx.inference.engines.embedded import generate
from tx.inference.engines.embedded.generate import Row, sample_next
from tx.inference.engines.embedded.sorting import ids_at, sorted_descending
from tx.inference.protocol import GenerateRequest


def per_call_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return round((time.perf_counter() - start) / repeats * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    figures = {}
    for vocab in (2048, 151_936):
        for rows in (8, 64):
            generator = torch.Generator().manual_seed(0)
            logits = torch.randn(rows, vocab, generator=generator)
            drawn = torch.randint(0, 50, (rows,), generator=generator)

            def full_sort(logits: torch.Tensor = logits, drawn: torch.Tensor = drawn) -> torch.Tensor:
                return torch.sort(logits, dim=-1, descending=True).indices.gather(1, drawn[:, None])[:, 0]

            def values_only(logits: torch.Tensor = logits, drawn: torch.Tensor = drawn) -> torch.Tensor:
                return ids_at(logits, sorted_descending(logits), drawn)

            assert torch.equal(full_sort(), values_only())
            before, after = per_call_ms(full_sort, args.repeats), per_call_ms(values_only, args.repeats)
            figures[f"{rows}x{vocab}"] = {"torch_sort_ms": before, "values_only_ms": after,
                                          "speedup": round(before / after, 2)}
    print(json.dumps({"threads": 1, "sort": figures, "routes": route_figures(args.repeats),
                      "load_average": os.getloadavg()[0]}, indent=2))


def route_figures(repeats: int) -> dict[str, dict[str, float]]:
    """One step's draw, every row sorted (before) against each row's own route (after), per setting."""
    figures = {}
    for vocab in (2048, 151_936):
        for rows in (8, 64):
            logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
            for name, top_k in (("temperature", -1), ("top_k_50", 50)):
                request = GenerateRequest(prompt_token_ids=[1], seed=0, temperature=1.0, top_k=top_k)
                batch = [Row.create(request, i, eos_ids=()) for i in range(rows)]
                own = per_call_ms(lambda batch=batch, logits=logits: sample_next(logits, batch), repeats)
                routes = generate.ROUTES
                generate.ROUTES = {route: generate.ROUTES["sorted"] for route in routes}  # every row sorted
                try:
                    sorted_ms = per_call_ms(lambda batch=batch, logits=logits: sample_next(logits, batch), repeats)
                finally:
                    generate.ROUTES = routes
                figures[f"{rows}x{vocab} {name}"] = {"all_sorted_ms": sorted_ms, "own_route_ms": own,
                                                     "speedup": round(sorted_ms / own, 2)}
    return figures


if __name__ == "__main__":
    main()
