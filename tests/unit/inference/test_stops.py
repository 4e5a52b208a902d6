"""Stop strings across an abort (tx.inference.engines.stops), on a one-character-per-token decode."""

from __future__ import annotations

from tx.inference.engines.stops import (
    cut_at_resumed_stop,
    first_stop_string_end,
    hits_stop_string,
    resumed_tail,
)


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_match_that_starts_in_the_earlier_text_counts():
    assert hits_stop_string(decode, ids("ab\n"), ids("\nc"), ["\n\n"])
    assert not hits_stop_string(decode, [], ids("\nc"), ["\n\n"])


def test_match_wholly_inside_the_earlier_text_does_not_count():
    assert not hits_stop_string(decode, ids("x\n\ny"), ids("z"), ["\n\n"])
    assert hits_stop_string(decode, ids("x\n\ny"), ids("z\n\n"), ["\n\n"])


def test_tail_is_bounded_by_the_longest_stop_string():
    prompt = ids("PROMPT") + ids("0123456789" * 3)
    assert resumed_tail(prompt, 30, ["ab"]) == prompt[-6:]  # 2 characters + 4 spare tokens
    assert resumed_tail(prompt, 3, ["abcdefgh"]) == prompt[-3:]  # never beyond what was generated
    assert resumed_tail(prompt, 0, ["ab"]) == [] == resumed_tail(prompt, 5, [])


def test_first_stop_string_end_cuts_after_the_completing_token():
    assert first_stop_string_end(decode, ids("END"), ids("!x!STOPmore"), ["D!", "STOP"]) == 1
    assert first_stop_string_end(decode, ids("..."), ids("abSTOPcd"), ["STOP"]) == 6
    assert first_stop_string_end(decode, ids("..."), ids("abcd"), ["STOP"]) is None
    assert first_stop_string_end(decode, ids("..."), ids("abcd"), []) is None


def test_cut_at_resumed_stop_ends_sequences_at_the_completing_token():
    from tx.inference.protocol import GeneratedSequence, GenerateRequest, GenerateResponse

    request = GenerateRequest(prompt_token_ids=ids("Q: hi\nA: line one\n"), resumed_tokens=9, stop_strings=["\n\n"])
    response = GenerateResponse(sequences=[
        GeneratedSequence(token_ids=ids("\nmore"), logprobs=[-1.0] * 5, stop_reason="length"),
        GeneratedSequence(token_ids=ids("two\n\n"), logprobs=[-1.0] * 5, stop_reason="stop"),
        GeneratedSequence(token_ids=ids("two"), logprobs=[-1.0] * 3, stop_reason="length"),
    ])
    cut = cut_at_resumed_stop(request, response, decode).sequences
    assert (cut[0].token_ids, cut[0].logprobs, cut[0].stop_reason) == (ids("\n"), [-1.0], "stop")
    assert cut[1:] == response.sequences[1:]  # vLLM's own match, and no match: unchanged
    fresh = request.model_copy(update={"resumed_tokens": 0})
    assert cut_at_resumed_stop(fresh, response, decode) == response
