"""Data for the trainer: text/JSONL -> tokenizer -> Megatron indexed dataset (.bin/.idx) -> GPT samples.

This package stays import-light (no torch, no megatron-core) so `prepare --help` and its cache check are instant;
the modules that need megatron-core import it where they use it.
"""


class DataError(ValueError):
    """Bad data input, reported before any work: the path or key, the bad value, and what would be valid."""
