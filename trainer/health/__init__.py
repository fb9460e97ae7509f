"""Health checks that name the bad node: straggler windows and the hang watchdog (docs/trainer.md#health-stragglers-and-hangs).

monitor      HealthMonitor: what the training loop holds (create, `step_done`, `close`)
straggler    which rank computes slower than the others, window after window, and on which node
watchdog     a thread per rank that ends a run in which no step completes, after dumping every stack
collectives  which collective a rank is in and how long it waited (a thin torch.distributed wrapper)
report       `<run_dir>/health.json`, for people and `make status`
"""
