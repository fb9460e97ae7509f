"""Measuring a trained model apart from training it.

score       `python -m trainer score`: mean loss per token and perplexity of a checkpoint on given tokens or
            a prepared dataset's token stream
generate    `python -m trainer generate`: text from a checkpoint with megatron-core's KV cache, streamed
jsonl       the JSONL files evaluation reads: one object a line with the string fields asked for
suite       the evaluation suite file (perplexity datasets, generation tasks), exact match, intervals
evaluate    `python -m trainer evaluate`: a checkpoint against a suite, in one process
harness     lm-evaluation-harness tasks on the exported model (`evaluate --harness-tasks`)
during_training  `evaluation.suite`: evaluate on the newest checkpoint at an interval, in a process of its own
"""
