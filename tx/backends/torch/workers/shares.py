"""How a step's datums are shared among the trainer workers, and how their answers add up again."""

from __future__ import annotations

from tx.types import Datum, TextChunk


def split_by_tokens(data: list[Datum], parts: int) -> list[list[Datum]]:
    """`data` cut into `parts` contiguous shares of about equal token counts (some may be empty)."""
    sizes = [_tokens(d) for d in data]
    total, shares, start, seen = sum(sizes), [], 0, 0
    for part in range(1, parts + 1):
        end = start
        while end < len(data) and (part == parts or seen + sizes[end] / 2 <= total * part / parts):
            seen += sizes[end]
            end += 1
        shares.append(data[start:end])
        start = end
    return shares


def _tokens(datum: Datum) -> int:
    return sum(
        len(c.tokens) if isinstance(c, TextChunk) else (c.expected_tokens or 1)
        for c in datum.model_input.chunks
    )


def combine_metrics(metrics: list[dict[str, float]], counts: list[int]) -> dict[str, float]:
    """Per-worker `name:reduction` metrics as one: sums add, max/min pick, means weigh by datum count (a
    worker without datums counts only in sums)."""
    busy = [m for m, c in zip(metrics, counts) if c] or metrics[:1]
    counts = [c for c in counts if c] or [0]
    combined: dict[str, float] = {}
    for name in busy[0]:
        values = [m[name] for m in busy if name in m]
        reduction = name.rsplit(":", 1)[-1]
        if reduction == "max":
            combined[name] = max(values)
        elif reduction == "min":
            combined[name] = min(values)
        elif reduction == "mean":
            weights = [c for m, c in zip(busy, counts) if name in m]
            combined[name] = sum(v * w for v, w in zip(values, weights)) / max(1, sum(weights))
        else:
            combined[name] = sum(values)
    return combined
