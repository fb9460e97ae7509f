"""Checkpoints, one concern per module:

store       the directory protocol any engine's checkpoint goes through: stage, seal with a manifest, publish
            (rename, `latest`, prune), find the newest intact one, agree on failure. No megatron import.
record      what a checkpoint records about its model (to rebuild it, and refuse a config it does not fit)
megatron    megatron-core dist_checkpointing save and load (`engine: megatron`, weights-only conversions)
deepspeed   DeepSpeed's format (`engine: deepspeed`): save into the store, read without DeepSpeed's engine
formats     the one dispatch on a directory's format: resolve, read what it saved, its full weights
start       which checkpoint a run starts from (its own newest, else checkpoint.load) and what stops it
"""
