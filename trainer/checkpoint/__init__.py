"""Checkpoints, one concern per module:

checkpointer  what the training loop calls: load() once, save() after each step (the interval, background saves
              published at a step boundary, the stop save, retention: keep_last, keep_best)
writer        a checkpoint being written (`Write`: done, finish) and the background writer (`Writer`)
digest        every byte's XXH3-128, hashed as the writers write and checked before a load
store         the directory protocol any engine's checkpoint goes through: stage, seal with a manifest, publish
              (rename, `latest`), retention's rule and pruning, find the newest intact one, agree on failure
record        what a checkpoint records about its model (to rebuild it, and refuse a config it does not fit)
version       the model version record written once beside each published checkpoint (config, data and
              tokenizer hashes, code, image, parent, metrics), and the evaluation results added later beside it
settings      the schedule and data settings a checkpoint was trained under, and a resume's changes to them
megatron      megatron-core dist_checkpointing save and load (`engine: megatron`, weights-only conversions)
deepspeed     DeepSpeed's format (`engine: deepspeed`): save into the store, read without DeepSpeed's engine
formats       the one dispatch on a directory's format: resolve, read what it saved, its full weights
start         which checkpoint a run starts from (its own newest, else checkpoint.load) and what stops it
"""
