"""Benchmark: the sort under the embedded engine's top-k / top-p sampling, at the tiny vocabulary and at Qwen3's.

Per call, on the cpu (where sampling happens), 1 torch thread: `torch.sort` of values and ids (before) against
`sorting.sorted_descending` + `sorting.ids_at` (values sorted by numpy, the id looked up at the drawn position
only), for 8 and 64 rows of 2,048 and 151,936 logits. Both give the same ids (checked). Prints JSON.

    python scripts/bench/sampling_sort.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import torch

from tx.inference.engines.embedded.sorting import ids_at, sorted_descending


def per_call_ms(fn: Callable[[], torch.Tensor], repeats: int) -> float:
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
    print(json.dumps({"threads": 1, "figures": figures, "load_average": os.getloadavg()[0]}, indent=2))


if __name__ == "__main__":
    main()
