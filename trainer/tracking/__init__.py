"""Tracking: runs and sweep trials where people compare them, in MLflow (a local SQLite store by default, a tracking
server's URI on a stack). Above config and models; below launch and the commands.

    mlflow_runs  one trainer run directory as one MLflow run: its config, its metrics.jsonl, its model version
"""
