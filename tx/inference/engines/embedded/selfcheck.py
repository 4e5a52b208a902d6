"""The embedded engine checks itself on the base model it loads, as the trainer checks its packing: never a
family served silently wrong, and never a list of names deciding it.

The engine's path differs from the trainer's forward in four ways, and a family's code can break each: it runs
its own attention function (`attention.py`), a KV cache filled by a prefill and one-token decode steps, rows of
different lengths left-padded into one batch, and rows that leave or are copied (`select_rows`: each cache
layer re-indexes its state) or join (`merge`). When the base model first loads, `check_serving` runs a few
seeded random prompts through each of those forms with teacher-forced continuations and compares every
position's log-softmax with the model's own forward of the whole sequence, one row, no cache, under the
family's own attention (what the trainer runs), by `tx.models.agreement`:

- `alone`: one row through the prefill and decode steps. If it fails under the engine's attention function and
  passes under the family's own, the engine runs the family's (GLM-5 builds its sparse attention mask only for
  implementations named `eager` or `sdpa`); if it fails under both, the engine refuses the model: every
  generate request gets a 400 naming the check.
- `padded`: prompts of different lengths in one left-padded batch (DeepSeek-V4's compressors window each row
  from column 0, pad included). Failing it, a batch holds one request, whose rows all have its prompt's length.
- `rows`: mid-decode, a row leaves and another is copied (DeepSeek-V4's cache reorder moves keys and values but
  not its compressor buffers). Failing it, a request's samples are prefilled as copies of its prompt and rows
  that stop stay in the batch (not sampled) until every row of it stops.
- `join`: a prefilled row joins a running batch, where the cache says it can (`DecodeBatch.joinable`). Failing
  it, no request joins a running batch.

A check that raises fails like one that differs. The log says what each check measured and what was chosen. A
model whose own forward raises on the check's prompts is served as it is (its requests fail with that error,
docs/engines.md#a-step-that-fails), with a warning that nothing was checked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from tx.inference.engines.embedded.generate import DecodeBatch
from tx.inference.engines.embedded.lean_decode import Plan
from tx.models.agreement import difference, tolerance

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

CHECK_LENGTHS = (9, 20, 5, 9)
"""The prompts' lengths: unequal, so the padded check pads; 20 plus the steps is longer than a tiny sliding
window (16); the two of 9 let rows be checked without padding."""
EQUAL = (0, 3)
"""Two prompts of one length."""
CHECK_STEPS = 6
"""Teacher-forced decode steps after each prompt."""
CHECK_SEED = 0

LeanFor = Callable[["PreTrainedModel"], Plan | None]
"""The lean decode step the engine would use for the model (`Weights.lean_plan`), or None."""


@dataclass(frozen=True)
class ServingPlan:
    """How the engine serves its base model, as the self-check decided."""

    attention: str
    """The attention implementation the model runs."""
    padded: bool = True
    """Rows of different lengths share a batch (left-padded)."""
    reorder: bool = True
    """Rows leave the batch and a prompt's rows are copied by re-indexing the cache."""
    joins: bool = True
    """Requests join a running batch."""
    refused: str | None = None
    """Why the engine cannot serve the model exactly in any form (every request is refused, naming it)."""
    measured: dict[str, float] = field(default_factory=dict)
    """Each check's difference (`tx.models.agreement.difference`; inf where it raised)."""


def check_serving(model: PreTrainedModel, pad_id: int, family_attention: str, lean_for: LeanFor) -> ServingPlan:
    """Run the checks on `model` (the base, no adapter, under `torch.inference_mode`), switch it to the family's
    own attention where the engine's differs (see the module's docstring), and say how to serve it."""
    config = model.config.get_text_config()
    bound = tolerance(model.dtype)
    prompts, steps = _check_tokens(int(config.vocab_size))
    engine_attention = str(model.config._attn_implementation)
    plan = ServingPlan(attention=engine_attention)
    try:
        with _attention(model, family_attention):
            reference = [_forward(model, prompt + cont) for prompt, cont in zip(prompts, steps)]
    except Exception as exc:  # noqa: BLE001  the model's own forward fails: each request will say so itself
        logger.warning("self-check: the model's own forward of the check's prompts raised %s: %s; nothing checked",
                       type(exc).__name__, exc)
        return plan
    check = _Check(model, pad_id, lean_for, prompts, steps, reference, bound)
    error = check.run("alone", _alone)
    if error > bound and engine_attention != family_attention:
        model.set_attn_implementation(family_attention)
        plan, error = replace(plan, attention=family_attention), check.run("alone", _alone, under=family_attention)
        logger.info("self-check: %s attention differs from the family's own by %.3g; running %s",
                    engine_attention, check.measured["alone"], family_attention)
    if error > bound:
        plan = replace(plan, refused=f"one row through the prefill and decode steps differs from the model's own "
                                     f"forward by {error:.3g} (self-check 'alone')")
        return _decided(replace(plan, measured=check.measured))
    if check.run("padded", _padded) > bound:
        plan = replace(plan, padded=False)
    if check.run("rows", _rows_leave_and_copy, padded=plan.padded) > bound:
        plan = replace(plan, reorder=False, joins=False)
    elif plan.padded and check.run("join", _join) > bound:
        plan = replace(plan, joins=False)
    return _decided(replace(plan, measured=check.measured))


def _decided(plan: ServingPlan) -> ServingPlan:
    measured = ", ".join(f"{name} {value:.2g}" for name, value in plan.measured.items())
    logger.info("self-check (%s): attention %s, padded batches %s, rows leave/copied %s, joins %s%s", measured,
                plan.attention, plan.padded, plan.reorder, plan.joins,
                f"; REFUSED: {plan.refused}" if plan.refused else "")
    return plan


def _check_tokens(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts and each one's continuation: seeded random tokens."""
    generator = torch.Generator().manual_seed(CHECK_SEED)
    tokens = [torch.randint(0, vocab, (n + CHECK_STEPS,), generator=generator).tolist() for n in CHECK_LENGTHS]
    return [t[:n] for t, n in zip(tokens, CHECK_LENGTHS)], [t[n:] for t, n in zip(tokens, CHECK_LENGTHS)]


@contextmanager
def _attention(model: PreTrainedModel, implementation: str) -> Iterator[None]:
    current = str(model.config._attn_implementation)
    if current == implementation:
        yield
        return
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def _forward(model: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    """The model's own log-softmax at every position of `tokens`: one row, no cache."""
    ids = torch.tensor([tokens], device=model.device)
    logits = model(input_ids=ids, use_cache=False).logits[0]
    return torch.log_softmax(logits.float().cpu(), dim=-1)


@dataclass
class _Check:
    """The check's inputs, and what each form measured."""

    model: PreTrainedModel
    pad_id: int
    lean_for: LeanFor
    prompts: list[list[int]]
    steps: list[list[int]]
    reference: list[torch.Tensor]
    bound: float
    measured: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, form: Callable[..., dict[int, torch.Tensor]], under: str = "",
            **options: bool) -> float:
        """Run `form` (which returns each checked row's log-softmax rows: the prompt's kept positions, then
        one per step) and record its largest difference from the reference; inf if it raised."""
        key = f"{name} ({under})" if under else name
        try:
            got = form(self, **options)
        except Exception as exc:  # noqa: BLE001  a form the family's code cannot run fails the check
            logger.info("self-check %s raised %s: %s", key, type(exc).__name__, exc)
            self.measured[key] = float("inf")
            return float("inf")
        if not got:  # the form does not apply to this model
            return 0.0
        full = self.bound < 1e-3
        self.measured[key] = max(difference(rows, self._want(i, len(rows)), full) for i, rows in got.items())
        return self.measured[key]

    def _want(self, i: int, count: int) -> torch.Tensor:
        """The reference's first `count` positions of sequence `i` (a checked row starts at its prompt's first)."""
        return self.reference[i][:count]

    def batch(self, indices: Sequence[int]) -> tuple[DecodeBatch, list[list[torch.Tensor]]]:
        """A prefilled batch of the prompts at `indices`, and each row's kept log-softmax rows so far."""
        batch = DecodeBatch(self.pad_id)
        prompts = [self.prompts[i] for i in indices]
        kept = batch.prefill(self.model, prompts, max(len(p) for p in prompts))
        rows = [[torch.log_softmax(kept[r, -len(p):].float(), dim=-1)] for r, p in enumerate(prompts)]
        return batch, rows

    def step(self, batch: DecodeBatch, tokens: list[int], rows: list[list[torch.Tensor]]) -> None:
        """Feed row r `tokens[r]` and keep its next position's log-softmax."""
        logits = batch.step(self.model, tokens, self.lean_for(self.model))
        for r, out in enumerate(torch.log_softmax(logits.float(), dim=-1)):
            rows[r].append(out[None])


def _decode(check: _Check, batch: DecodeBatch, indices: list[int], rows: list[list[torch.Tensor]],
            first: int, last: int) -> None:
    """Decode steps `first`..`last - 1` of every row: step k feeds its sequence's continuation token k."""
    for k in range(first, last):
        check.step(batch, [check.steps[i][k] for i in indices], rows)


def _finish(indices: Sequence[int], rows: list[list[torch.Tensor]]) -> dict[int, torch.Tensor]:
    return {i: torch.cat(row) for i, row in zip(indices, rows)}


def _alone(check: _Check) -> dict[int, torch.Tensor]:
    got = {}
    for i in range(len(check.prompts)):
        batch, rows = check.batch([i])
        _decode(check, batch, [i], rows, 0, CHECK_STEPS - 1)
        got |= _finish([i], rows)
    return got


def _padded(check: _Check) -> dict[int, torch.Tensor]:
    indices = list(range(len(check.prompts)))
    batch, rows = check.batch(indices)
    _decode(check, batch, indices, rows, 0, CHECK_STEPS - 1)
    return _finish(indices, rows)


def _rows_leave_and_copy(check: _Check, padded: bool) -> dict[int, torch.Tensor]:
    """Two steps, then the first row leaves and the last is copied (as `num_samples` copies a prompt's row).
    Without padding, rows of two prompts of one length (copies of one prompt would hide a state left behind)."""
    indices = list(range(len(check.prompts))) if padded else [EQUAL[0], EQUAL[1], EQUAL[0]]
    batch, rows = check.batch(indices)
    _decode(check, batch, indices, rows, 0, 2)
    keep = list(range(1, len(indices))) + [len(indices) - 1]
    batch.select_rows(keep)
    indices, rows = [indices[r] for r in keep], [list(rows[r]) for r in keep]
    _decode(check, batch, indices, rows, 2, CHECK_STEPS - 1)
    return _finish(indices, rows)


def _join(check: _Check) -> dict[int, torch.Tensor]:
    """The first two prompts decode two steps; the third, prefilled alone, joins them. Nothing to check (an
    empty result) where the cache takes no joins: the engine never merges such batches."""
    indices = [0, 1]
    batch, rows = check.batch(indices)
    _decode(check, batch, indices, rows, 0, 2)
    if not batch.joinable:
        return {}
    other, other_rows = check.batch([2])
    batch.merge(other)
    indices, rows = indices + [2], rows + other_rows
    for k in range(2, CHECK_STEPS - 1):  # the joined row is two steps behind the others
        check.step(batch, [check.steps[i][k] for i in indices[:2]] + [check.steps[2][k - 2]], rows)
    return _finish(indices, rows)  # the joined row: its prompt and CHECK_STEPS - 3 steps
