"""The model, apart from how it is parallelised: Llama on megatron-core, its arithmetic and loss.

llama       megatron-core's GPTModel configured as Llama (TE or local layer spec), layout-free initialization
attention   core attention through torch SDPA where TransformerEngine is missing
flops       parameter counts and model FLOPs without torch (MFU, the planner), the kernels' names
loss        the per-token loss over the global batch (masked sum and count, reduced once)
weights     full weights: unsharded parameters under one naming, every conversion's intermediate
"""
