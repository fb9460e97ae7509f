"""Monitoring: metrics defined once (registry.py), exported by pull (prometheus.py) and push (cloudwatch.py),
read from the node (node.py), and turned into alert rules and dashboards (rules.py, dashboards.py).

The training loop calls the process-wide functions below; docs/monitoring.md says how to watch a run.
"""

from trainer.monitoring.monitor import begin_step, end_step, listen_problems, record, start, stop, timed

__all__ = ["begin_step", "end_step", "listen_problems", "record", "start", "stop", "timed"]
