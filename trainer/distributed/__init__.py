"""Process groups, the fast path, and how the trainer meets megatron-core (its bridges, its JIT on CPU).

parallel         process groups (NCCL or gloo), megatron-core's parallel state and DDP, for a ParallelDims layout
                 (trainer/config/layout.py)
optimizer        AdamW through megatron-core's optimizer stack, and the warmup + decay LR schedule
fast_path        the GPU fast path's runtime pieces (TransformerEngine userbuffers, FP8, overlap)
megatron_compat  the one place that bridges megatron-core's assumptions of CUDA, applied only without it
cpu_jit          megatron-core's fused functions left uncompiled where CUDA is absent
lifetime         a trainer process started by another ends with it (PR_SET_PDEATHSIG)
"""
