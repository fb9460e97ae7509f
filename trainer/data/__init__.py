"""Data for the trainer: text/JSONL -> tokenizer -> Megatron indexed dataset (.bin/.idx) -> GPT samples.

    prepare    `python -m trainer prepare`: documents to a tokenized, indexed dataset with its manifest
    validate   what prepare checks as it reads: bad, empty, outlying and repeated records, the reject rate
    merge      `python -m trainer merge`: shards prepared apart, one dataset, byte for byte as one prepare
    sources    where documents come from: files, directories, JSONL, the Python standard library
    tokenizer  byte-level BPE training, Hugging Face tokenizer.json reading
    chat_template  the built-in chat template of the project's BPE tokenizer (prepare and exports share it)
    indexed    the .bin/.idx files, written with numpy alone
    manifest   PREFIX.manifest.json: what a dataset was made from and what it holds
    datasets   GPT samples through megatron-core's GPTDataset and blended builder; the data checks
    sampler    micro-batches for one data-parallel rank from a position in the sample stream
    loader     a run's train and validation samples and each rank's micro-batch streams
    chat       `prepare --format chat`: conversations through a chat template into tokens and a loss mask
    packing    fine-tuning samples: conversations packed into full sequences, no attention or position across them
    stdlib_chat the built-in chat set: questions on the standard library's functions, made from its sources

This package stays import-light (no torch, no megatron-core) so `prepare --help` and its cache check are instant;
the modules that need megatron-core import it where they use it.
"""


class DataError(ValueError):
    """Bad data input, reported before any work: the path or key, the bad value, and what would be valid."""
