"""Model versions: what made each published checkpoint, its evaluations, and the tags serving asks for.

record    a checkpoint's model version record (config, data and tokenizer hashes, code, image, parent, metrics),
          written once beside it, and the evaluation results added later beside the record
registry  the versions under a local directory or in a stack's checkpoints bucket, and their append-only tags
command   `python -m trainer models list | show | promote`
pipeline  `python -m trainer finetune-stages`: evaluate -> promote -> export of a run's newest checkpoint, each once
"""
