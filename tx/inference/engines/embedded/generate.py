"""The batched decode: left-padded prefill into a KV cache, one-token decode steps, per-row sampling.

Design / who owns what:
- `DecodeBatch` owns the model inputs of one batch (cache, attention mask, positions) and nothing else; the
  scheduler decides when to step it, and holds the weights lock around each call. Inputs and cache live on the
  model's device (cpu or a GPU); the logits it returns are always on the cpu, where sampling happens.
- `Row` is one sample: its sampling settings, its own `torch.Generator`, its tokens and RAW logprobs
  (log_softmax of the unprocessed fp32 logits), and its stop rules.
- `sample_next` turns a step's logits into one token per row: argmax for temperature 0, otherwise inverse-CDF
  sampling with one uniform draw per row from the row's generator, so a seeded row gives the same tokens
  whatever batch it runs in: over the unsorted distribution for temperature alone, over the k best (a partial
  selection) for top-k, over the sorted logits for top-p alone. A row that asks for it also
  gets the k most likely tokens of each step with their raw logprobs. Ids the model must never be handed
  as text beside images (a vision-language model's placeholders, `Weights.never_sampled`) are masked in the
  draw only: the distribution drawn from is renormalised over the other ids, the logprobs reported stay the
  raw model's (docs/model-families.md#image-placeholder-tokens-in-text).
- The prompt's own scores come from the prefill's kept logits: prompt logprobs and top-k (`prompt_logprobs`),
  the logprobs of chosen ids (`target_logprobs`), and k draws per position (`alternative_tokens`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tx.inference.engines.embedded.kv_room import RoomyLayer, give_room
from tx.inference.engines.embedded.lean_decode import Plan
from tx.inference.engines.embedded.sorting import ids_at, sorted_descending
from tx.inference.engines.embedded.vision import PromptVision, batch_vision, rope_positions, step_positions
from tx.inference.engines.stops import hits_stop_string, resumed_tail
from tx.inference.protocol import GeneratedSequence, GenerateRequest, StopReasonName
from tx.multimodal.placeholders import text_placeholders_apart


@dataclass
class Row:
    """One sample being generated."""

    request: GenerateRequest
    sample_index: int
    stop_ids: frozenset[int]
    generator: torch.Generator = field(repr=False)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: StopReasonName | None = None
    stop_tail: list[int] = field(default_factory=list)  # earlier tokens of a resumed sample (tx.inference.engines.stops)
    topk: list[list[tuple[int, float]]] = field(default_factory=list)  # per sampled token, when asked for

    @classmethod
    def create(cls, request: GenerateRequest, sample_index: int, eos_ids: Sequence[int]) -> Row:
        seed = request.seed + sample_index if request.seed is not None else random.getrandbits(62)
        stop_ids = set(request.stop_token_ids) | (set(eos_ids) if request.stop_at_eos else set())
        row = cls(request, sample_index, frozenset(stop_ids), torch.Generator().manual_seed(seed))
        row.stop_tail = resumed_tail(request.prompt_token_ids, request.resumed_tokens, request.stop_strings)
        if request.max_tokens == 0:
            row.stop_reason = "length"
        return row

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def sequence(self) -> GeneratedSequence:
        """The finished sample (once `done`)."""
        assert self.stop_reason is not None, "the row has not stopped"
        topk = self.topk if self.request.topk_sample_logprobs > 0 else None
        return GeneratedSequence(token_ids=self.token_ids, logprobs=self.logprobs, stop_reason=self.stop_reason,
                                 topk_logprobs=topk)

    def append(self, token: int, logprob: float, decode: Callable[[list[int]], str] | None,
               topk: list[tuple[int, float]] | None = None) -> None:
        """Record a sampled token and decide whether the row stops here (the stop token is kept)."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if topk is not None:
            self.topk.append(topk)
        if token in self.stop_ids or self.request.stop_strings and decode is not None and self._hit_stop_string(decode):
            self.stop_reason = "stop"
        elif len(self.token_ids) >= self.request.max_tokens:
            self.stop_reason = "length"

    def _hit_stop_string(self, decode: Callable[[list[int]], str]) -> bool:
        return hits_stop_string(decode, self.stop_tail, self.token_ids, self.request.stop_strings)


Step = tuple[list[int], list[float], list[list[tuple[int, float]] | None]]
BLOCK = 1024
"""Ids per block of the plain draw's two-level CDF (`_draw_plain`)."""
CHUNK_LOGITS = 8 * 151_936
"""Logits sampled together (8 rows at Qwen3's vocabulary): a step's temporaries then stay ~5 MB each, in cache
and under glibc's mmap threshold (bigger ones are mapped and faulted in afresh every step): 64 rows ~2x faster."""


def sample_next(logits: torch.Tensor, rows: Sequence[Row], never: Sequence[int] = ()) -> Step:
    """One token per row from `logits` [rows, vocab] (fp32), the raw logprob of each, and the k most likely
    (token, raw logprob) of the rows that ask for them (None for the others); no row draws an id of
    `never`. Rows go CHUNK_LOGITS logits at a time (each row's draw is its own, so the tokens are the same)."""
    at_once = max(1, CHUNK_LOGITS // logits.shape[-1])
    if len(rows) > at_once:
        parts = [sample_next(logits[i:i + at_once], rows[i:i + at_once], never)
                 for i in range(0, len(rows), at_once)]
        return ([t for p in parts for t in p[0]], [lp for p in parts for lp in p[1]],
                [k for p in parts for k in p[2]])
    logits = logits.float()
    drawn = logits.index_fill(1, torch.tensor(never, dtype=torch.long), float("-inf")) if never else logits
    sampled = [i for i, row in enumerate(rows) if row.request.temperature > 0]
    if len(sampled) == len(rows):  # every row samples: no argmax, no row selection
        tokens = _sample_rows(drawn, rows)
    else:
        tokens = drawn.argmax(dim=-1)
        if sampled:
            index = torch.tensor(sampled)
            tokens[index] = _sample_rows(drawn[index], [rows[i] for i in sampled])
    # log_softmax(x)[t] = x[t] - logsumexp(x): no [rows, vocab] logprob tensor per step
    norm = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, tokens[:, None])[:, 0] - norm
    topk: list[list[tuple[int, float]] | None] = [None] * len(rows)
    k = max(row.request.topk_sample_logprobs for row in rows)
    if k > 0:
        best = logits.topk(min(k, logits.shape[-1]), dim=-1)
        ids, values = best.indices.tolist(), (best.values - norm[:, None]).tolist()
        for i, row in enumerate(rows):
            if (wanted := row.request.topk_sample_logprobs) > 0:
                topk[i] = list(zip(ids[i][:wanted], values[i][:wanted]))
    return tokens.tolist(), chosen.tolist(), topk


def _sample_rows(logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """One draw per row with the row's own generator, each row by the cheapest exact route: plain temperature
    from the unsorted distribution, top-k from a partial selection of the k best, top-p alone from a full sort."""
    vocab = logits.shape[-1]
    routes: dict[str, list[int]] = {"plain": [], "top_k": [], "sorted": []}
    for i, row in enumerate(rows):
        routes["top_k" if 0 < row.request.top_k < vocab else "plain" if row.request.top_p >= 1.0 else "sorted"
               ].append(i)
    draw = ROUTES
    taken = [(route, members) for route, members in routes.items() if members]
    if len(taken) == 1:  # every row one route: no row selection
        return draw[taken[0][0]](logits, rows)
    tokens = torch.empty(len(rows), dtype=torch.long)
    for route, members in taken:
        index = torch.tensor(members)
        tokens[index] = draw[route](logits[index], [rows[i] for i in members])
    return tokens


def _uniforms(rows: Sequence[Row]) -> torch.Tensor:
    """One uniform draw in [0, 1) per row, from each row's generator: a seeded row draws the same in any batch."""
    return torch.stack([torch.rand((), generator=row.generator) for row in rows])


def _draw_plain(logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """Temperature only: inverse-CDF sampling over the ids in vocabulary order, no sort. The CDF is never
    written out whole: the draw first finds its block of `BLOCK` ids from the blocks' sums, then its id within
    that block, both in float64, so a vocabulary of 151,936 adds no rounding a token's probability would notice."""
    temperatures = [row.request.temperature for row in rows]
    scaled = logits if all(t == 1.0 for t in temperatures) else logits / torch.tensor(temperatures)[:, None]
    weights = (scaled - scaled.amax(dim=-1, keepdim=True)).exp_()  # softmax's numerators
    vocab = weights.shape[-1]
    whole = vocab - vocab % BLOCK
    sums = weights[:, :whole].reshape(len(rows), -1, BLOCK).sum(dim=-1, dtype=torch.float64)
    if whole < vocab:
        sums = torch.cat([sums, weights[:, whole:].sum(dim=-1, keepdim=True, dtype=torch.float64)], dim=-1)
    block_cdf = sums.cumsum(dim=-1)
    draws = _uniforms(rows).double() * block_cdf[:, -1]
    block = _first_reaching(block_cdf, draws)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    ids = block[:, None] * BLOCK + torch.arange(BLOCK)[None, :]
    within = torch.where(ids < vocab, weights.gather(1, ids.clamp(max=vocab - 1)), 0.0)
    return block * BLOCK + _first_reaching(within.cumsum(dim=-1, dtype=torch.float64), draws - before)


def _first_reaching(cdf: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Per row, the first position whose `cdf` reaches its draw, the draw held inside (0, the row's total]: a
    position of weight 0 is never it (its CDF equals its predecessor's), whatever the rounding."""
    held = torch.minimum(draws.clamp(min=torch.finfo(torch.float64).tiny), cdf[:, -1])
    return torch.searchsorted(cdf, held[:, None]).clamp(max=cdf.shape[-1] - 1)[:, 0]


def _draw_top_k(logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """Top-k (and top-p within it): the k best of each row by a partial selection (`topk`), not a full sort."""
    vocab = logits.shape[-1]
    best = logits.topk(max(row.request.top_k if row.request.top_k > 0 else vocab for row in rows), dim=-1)
    return best.indices.gather(1, _draw_from_descending(best.values, rows)[:, None])[:, 0]


def _draw_sorted(logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """Top-p over the whole vocabulary: the values sorted (`sorting.py`), the drawn position's id looked up."""
    sorted_logits = sorted_descending(logits)
    return ids_at(logits, sorted_logits, _draw_from_descending(sorted_logits, rows))


def _draw_from_descending(values: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """The drawn position of each row of `values` [rows, n] (each row's logits, largest first): temperature,
    the row's top-k and top-p masks (each skipped where it masks nothing), then inverse-CDF sampling."""
    width = values.shape[-1]
    temperature = torch.tensor([row.request.temperature for row in rows])
    scaled = values / temperature[:, None]
    if any(0 < row.request.top_k < width for row in rows):
        top_k = torch.tensor([row.request.top_k if row.request.top_k > 0 else width for row in rows])
        scaled = scaled.masked_fill(torch.arange(width)[None, :] >= top_k[:, None], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if any(row.request.top_p < 1.0 for row in rows):
        top_p = torch.tensor([row.request.top_p for row in rows])
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill((mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0), 0.0)
    cdf = probs.cumsum(dim=-1)
    draws = _uniforms(rows) * cdf[:, -1]
    return torch.searchsorted(cdf, draws[:, None]).clamp(max=width - 1)[:, 0]


ROUTES: dict[str, Callable[[torch.Tensor, Sequence[Row]], torch.Tensor]] = {
    "plain": _draw_plain, "top_k": _draw_top_k, "sorted": _draw_sorted,
}
"""Each route's draw (`scripts/bench/sampling_sort.py` sends every row through "sorted" to compare)."""


@dataclass
class PromptLogprobs:
    values: list[float | None]
    topk: list[list[tuple[int, float]] | None] | None


def first_scored_position(prompt_len: int, last_n: int | None) -> int:
    """The first prompt position that gets a logprob (position 0 never does)."""
    return max(1, prompt_len - last_n) if last_n is not None else 1


def prompt_logprobs(kept: torch.Tensor, prompt: list[int], last_n: int | None, k: int) -> PromptLogprobs:
    """Prompt logprobs from `kept` [K, vocab]: the logits of the row's last K positions (right-aligned)."""
    length, num_kept = len(prompt), kept.shape[0]
    first = first_scored_position(length, last_n)
    offset = length - num_kept  # position of kept[0]
    logprobs = torch.log_softmax(kept[first - 1 - offset : length - 1 - offset].float(), dim=-1)
    targets = torch.tensor(prompt[first:length], dtype=torch.long)
    values: list[float | None] = [None] * first
    values += logprobs.gather(1, targets[:, None])[:, 0].tolist()
    topk = None
    if k > 0:
        best = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        rows = [list(zip(ids, vals)) for ids, vals in zip(best.indices.tolist(), best.values.tolist())]
        topk = [None] * first + rows
    return PromptLogprobs(values, topk)


def first_target_row(target_ids: list[list[int]]) -> int:
    """The first row of target_token_ids that names an id (len(rows) when none does)."""
    return next((r for r, row in enumerate(target_ids) if any(t >= 0 for t in row)), len(target_ids))


def target_logprobs(kept: torch.Tensor, request: GenerateRequest) -> list[list[float]]:
    """The raw logprob of each id of `target_token_ids` (row i at prompt position i + 1), 0.0 where none is named;
    rows before the first that names one are not scored."""
    assert request.target_token_ids is not None
    ids = torch.tensor(request.target_token_ids, dtype=torch.long).reshape(len(request.target_token_ids), -1)
    length, out = len(request.prompt_token_ids), torch.zeros(ids.shape, dtype=torch.float32)
    first, offset = first_target_row(request.target_token_ids), length - kept.shape[0]
    if first < ids.shape[0] and ids.shape[1]:
        logprobs = torch.log_softmax(kept[first - offset : length - 1 - offset].float(), dim=-1)
        rows = ids[first:]
        out[first:] = torch.where(rows >= 0, logprobs.gather(1, rows.clamp(min=0)), 0.0)
    return out.tolist()


def alternative_tokens(kept: torch.Tensor, request: GenerateRequest) -> tuple[list[list[int]], list[list[float]]]:
    """`prompt_alt_tokens_k` draws with replacement at every prompt position after the first, from the
    next-token distribution at the request's temperature (argmax at 0; no top-k or top-p), and their raw
    logprobs. Seeded requests draw from a generator seeded with seed + n (their samples use seed + i, i < n)."""
    length, k = len(request.prompt_token_ids), request.prompt_alt_tokens_k
    offset = length - kept.shape[0]
    logits = kept[0 - offset : length - 1 - offset].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if request.temperature == 0:
        tokens = logits.argmax(dim=-1, keepdim=True).expand(-1, k)
    else:
        seed = request.seed + request.n if request.seed is not None else random.getrandbits(62)
        probs = torch.softmax(logits / request.temperature, dim=-1)
        tokens = torch.multinomial(probs, k, replacement=True, generator=torch.Generator().manual_seed(seed))
    return tokens.tolist(), logprobs.gather(1, tokens).tolist()


def logits_needed(request: GenerateRequest) -> int:
    """How many trailing positions of this prompt need logits (1 = only the next-token distribution)."""
    length, needed = len(request.prompt_token_ids), 1
    if request.prompt_logprobs or request.topk_prompt_logprobs:
        needed = length - first_scored_position(length, request.prompt_logprobs_last_n) + 1
    if request.target_token_ids is not None:
        needed = max(needed, length - first_target_row(request.target_token_ids))
    if request.prompt_alt_tokens_k:
        needed = length
    return max(1, needed)


class DecodeBatch:
    """Model inputs of one left-padded batch and its KV cache.

    With images (a vision-language model), the prefill also takes the rows' pixel inputs and multimodal
    rotary positions; `rope_deltas` then shifts each row's rope positions in the decode steps."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id
        self.cache = None
        self.mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.rope_deltas: torch.Tensor | None = None

    def prefill(
        self,
        model: torch.nn.Module,
        prompts: Sequence[list[int]],
        num_kept: int,
        visions: Sequence[PromptVision | None] = (),
    ) -> torch.Tensor:
        """Run the prompts; returns the logits of each row's last `num_kept` positions [B, K, vocab]."""
        device = _device_of(model)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, self.mask = ids.to(device), mask.to(device)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        extra: dict[str, torch.Tensor] = {}
        position_ids = positions
        if any(v is not None for v in visions):
            extra = batch_vision(list(visions), [width - len(p) for p in prompts], width)
            extra = {key: value.to(device) for key, value in extra.items()}
            if "pixel_values" in extra:  # images: multimodal rope positions; audio takes the text's
                position_ids, self.rope_deltas = rope_positions(model, ids, self.mask, positions, extra)
        with text_placeholders_apart(model, ids, extra) as model_ids:  # placeholders in text rows stay text
            out = model(
                input_ids=model_ids,
                attention_mask=self.mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=min(num_kept, width),
                **extra,
            )
        self.cache = out.past_key_values
        give_room(self.cache)
        self.positions = positions[:, -1] + 1
        return out.logits.to("cpu")

    def step(self, model: torch.nn.Module, tokens: Sequence[int], lean: Plan | None = None) -> torch.Tensor:
        """Feed one token per row; returns the next-token logits [B, vocab]. `lean`: `model`'s lean decode step
        for rows of its active adapter (`lean_decode.py`; the same logits)."""
        assert self.mask is not None and self.positions is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        positions = self.positions[:, None]
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self.mask.device)[:, None]
        if lean is not None and self.rope_deltas is None:
            self.positions = self.positions + 1  # a new tensor: `positions` keeps this step's
            return lean.step(input_ids, self.mask, positions, self.cache).to("cpu")
        if self.rope_deltas is not None:
            positions = step_positions(self.positions, self.rope_deltas)
        out = model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        self.positions = self.positions + 1
        return out.logits[:, -1].to("cpu")

    def select_rows(self, indices: Sequence[int]) -> None:
        """Keep only the rows at `indices`, in that order (drops finished rows; repeats copy a row), then drop the
        leading columns no row attends to any more (a long row that left), so the cache is as wide as the
        longest live row.

        Every cache layer re-indexes its own state (`reorder_cache`): softmax attention's keys and values,
        a sliding window's, and a linear-attention layer's convolution and recurrent states alike (its
        `batch_select_indices` would skip the latter)."""
        assert self.mask is not None and self.positions is not None and self.cache is not None  # after prefill
        index = torch.tensor(indices, dtype=torch.long, device=self.mask.device)
        self.cache.reorder_cache(index)
        self.mask = self.mask[index]
        self.positions = self.positions[index]
        if self.rope_deltas is not None:
            self.rope_deltas = self.rope_deltas[index]
        if indices and self.joinable:
            self._trim()

    @property
    def joinable(self) -> bool:
        """Whether rows may join this batch (`merge`): text rows over a cache of plain growing layers, whose keys
        and values can be left-padded (a sliding window, a linear-attention state or image rope offsets cannot)."""
        from transformers.cache_utils import DynamicLayer

        layers = getattr(self.cache, "layers", None)
        growing = (DynamicLayer, RoomyLayer)
        return self.rope_deltas is None and bool(layers) and all(type(layer) in growing for layer in layers)

    def merge(self, other: DecodeBatch) -> None:
        """Append `other`'s rows (prefilled, both batches `joinable`) after this batch's: the narrower one is
        left-padded (zero keys and values, mask 0), so every row's tokens stay right-aligned."""
        assert self.mask is not None and other.mask is not None and self.positions is not None
        assert other.positions is not None and self.cache is not None and other.cache is not None
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width, -2), _pad_left(theirs.keys, width, -2)])
            mine.values = torch.cat([_pad_left(mine.values, width, -2), _pad_left(theirs.values, width, -2)])
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(other.mask, width, 1)])
        self.positions = torch.cat([self.positions, other.positions])

    def _trim(self) -> None:
        assert self.mask is not None and self.cache is not None
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first == 0:
            return
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]

    @property
    def num_rows(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros prepended along `dim` up to `width`."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
