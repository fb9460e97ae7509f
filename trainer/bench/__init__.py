"""`make bench` / `make bench-gpu`: measured side by side, each result against a baseline from the same run.

command.py        `python -m trainer bench [--gpu]`: run the suite, write runs/bench/bench.json, print a table
report.py         a report's rows and machine record, shared by the CPU and GPU suites
data.py           `prepare` against a single-process tokenizer loop writing the same .bin/.idx
disk.py           the disk's sequential write speed, for checkpoint throughput to stand against
training.py       start bench workers under torchrun; tokens/s, pipeline idle time, memory against the planner
worker.py         one process of a measured run: the trainer's own build and step, instrumented
checkpointing.py  checkpoint save and load speed, and the background save's stall, inside a worker
overhead.py       the trainer's step against a bare megatron-core loop of the same shape
allocations.py    allocated tensor bytes over time (what CUDA's allocator statistics count), on CPUs too
allreduce.py      all-reduce bus bandwidth over message sizes (NCCL on GPUs, gloo on CPUs)
gpu.py            the GPU suite: a ~1B Llama at sequence 4096 on one GPU, and the all-reduce sweep
sweep.py          the hyperparameter sweep (TPE, pruning) against the recipe's values and unpruned random search
pruning.py        pruning rules replayed on random search's whole trials: which they stop, the best among them?
serving.py        the local server against `trainer generate` on the same prompts, and a bounded load test of it
hf_baseline.py    the same shape trained by a plain transformers SDPA loop: the GPU suite's baseline
"""
