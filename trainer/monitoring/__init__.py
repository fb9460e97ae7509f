"""Monitoring: metrics defined once (trainer/contract/metrics.py, shared with the stack's alarms and dashboard),
exported by pull (prometheus.py) and push (cloudwatch.py), read from the node (node.py), and turned into alert
rules and dashboards (rules.py, dashboards.py). The training loop calls monitor.py's process-wide functions;
docs/monitoring.md says how to watch a run.
"""
