"""The trainer config's `monitoring:` section (trainer/config/schema.py holds it as `TrainConfig.monitoring`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

Switch = Literal["auto", "on", "off"]


class MonitoringConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers, as every section's

    # Prometheus endpoint per process at prometheus_port + local rank; auto: on where CUDA GPUs are, off on CPU.
    prometheus: Switch = "auto"
    prometheus_port: int = Field(9500, ge=1024, le=65535 - 64)  # room for a node's ranks above it
    prometheus_address: str = "0.0.0.0"
    # At a clean end, serve at most this long for a scrape to read the completion (twice the scrape interval seen,
    # not at all when nothing scraped); Prometheus's default scrape_interval is 1m (its configuration docs).
    final_scrape_timeout_seconds: PositiveFloat = 150
    # CloudWatch embedded metric format lines on stdout; auto: on under AWS Batch (AWS_BATCH_JOB_ID is set).
    cloudwatch: Switch = "auto"
    # At most one CloudWatch line per dimension group this often (CloudWatch's standard resolution is 60 s).
    cloudwatch_interval_seconds: PositiveFloat = 60
