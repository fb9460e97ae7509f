"""The planner: which parallel layout to train a config with on a stack, how much memory each GPU needs, and how
long and how much the run takes. Imports no torch (like trainer/config/), so it runs anywhere.

    memory.py       per-GPU memory of a layout, as this trainer allocates it
    performance.py  step time: compute, pipeline bubble, tensor/pipeline/data-parallel communication
    search.py       every layout `train` accepts on N nodes, estimated and ranked
    fit.py          the estimate against a GPU's free memory: the check before the first step, the largest micro-batch
    cost.py         dollars per purchase option, the deadline's pick, data transfer, energy and emissions estimates
    measure.py      `plan --measure N`: the N best local layouts trained a few steps each, repeated and
                    interleaved, a layout written over the planner's first only beyond the runs' spread
    checkpoint_costs.py  a save's and a restart's cost: a run's ledger, checked against the plan, or estimated
                    from the checkpoint's size and the stack's storage throughput
    command.py      `python -m trainer plan`: the table, the chosen layout as a config fragment, and the checkpoint
                    interval from the interruption rate (trainer/cost/resilience.py)
"""
