"""Monitoring: metrics defined once (trainer/contract/metrics.py, shared with the stack's alarms and dashboard),
exported by pull (prometheus.py) and push (cloudwatch.py), read from the node (node.py), and turned into alert
rules and dashboards (rules.py, dashboards.py). The training loop calls exporters.py's process-wide functions
(the one `Monitor` of each process); config.py is the trainer config's `monitoring:` section. docs/monitoring.md
says how to watch a run.
"""
