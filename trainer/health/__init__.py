"""Health checks that name the bad node: straggler windows and the hang watchdog (docs/trainer.md#health-stragglers-and-hangs).

`monitor.HealthMonitor` is what the training loop holds; `retry` (no torch) is what the launcher reads.
"""
