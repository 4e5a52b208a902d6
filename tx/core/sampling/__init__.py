"""Sampling: samplers (sampling sessions) and what they sample from (`samplers.py`), asample and direct
samples through the engine manager (`service.py`), and text in, text out for the OpenAI-compatible routes
(`text.py`)."""
