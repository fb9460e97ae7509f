"""Model versions: what made each published checkpoint, its evaluations, and the tags serving asks for.

Each version's record is written by the checkpointer (trainer/checkpoint/version.py); this package finds, tags and
ships them.

registry  the versions under a local directory or in a stack's checkpoints bucket, and their append-only tags
command   `python -m trainer models list | show | promote`
pipeline  `python -m trainer finetune-stages`: evaluate -> promote -> export of a run's newest checkpoint, each once
"""
