"""Process groups and layouts, the fast path, and how the trainer meets megatron-core (its bridges, its JIT on CPU)."""
