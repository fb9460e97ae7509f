"""Runs on a stack's cluster: submit the trainer as an AWS Batch multi-node job, follow it, push images and data."""
