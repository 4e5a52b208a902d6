"""The SDK datums tests train on: one next-token (SFT) datum over a token list, every target weighted."""

from __future__ import annotations

from tinker import types


def sft_datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
