"""Processes and their groups: torchrun and its supervisor, process groups, the fast path, and how the trainer meets
megatron-core (its bridges, its JIT on CPU).

torchrun         the rendezvous, torchrun's command line (torch.distributed.run), and `supervise` (SIGTERM to the
                 ranks, the stop grace, orphans reaped): every backend's
local            the machine at hand: `train` outside torchrun starts torchrun here, `convert`/`score` re-run
                 themselves under it, and `single_process` is a world of one (generate, evaluate, convert)
quick_exit       ending a process without the interpreter's last full collection (a second each with torch imported)

parallel         process groups (NCCL or gloo), megatron-core's parallel state and DDP, for a ParallelDims layout
                 (trainer/config/layout.py)
optimizer        AdamW through megatron-core's optimizer stack, and the warmup + decay LR schedule
fast_path        the GPU fast path's runtime pieces (TransformerEngine userbuffers, FP8, overlap)
megatron_compat  the one place that bridges megatron-core's assumptions of CUDA, applied only without it
cpu_jit          megatron-core's fused functions left uncompiled where CUDA is absent
lifetime         a trainer process started by another ends with it (PR_SET_PDEATHSIG)
"""
