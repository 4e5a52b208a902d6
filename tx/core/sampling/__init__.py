"""Sampling: samplers (sampling sessions) and what they sample from (`samplers.py`), asample and direct
samples through the engine manager (`service.py`) after their checks, quotas and fair-share turn
(`admission.py`, `gate.py`), and text in, text out for the OpenAI-compatible routes (`text.py`, decoding a
token at a time with `detokenize.py`)."""
