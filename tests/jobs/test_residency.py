"""Data residency at `make train STACK=...`: a bucket outside the stack's allowed regions is refused before submit."""

from __future__ import annotations

import json

import pytest

from .conftest import Stack
from .test_submit import submit_in_process


def move_bucket(stack: Stack, output: str, region: str) -> str:
    """Point the stack's `output` at a bucket that S3 keeps in `region` (GetBucketLocation answers it)."""
    bucket = f"elsewhere-{output.replace('_', '-')}"
    stack.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    stack.outputs_file.write_text(json.dumps({**stack.outputs, output: bucket}))
    return bucket


@pytest.mark.parametrize(
    ("output", "what"), [("datasets_bucket", "dataset"), ("checkpoints_bucket", "checkpoint")]
)
def test_a_bucket_in_another_region_is_refused_before_submitting(stack, capsys, output, what):
    bucket = move_bucket(stack, output, "eu-west-1")
    status, stderr = submit_in_process(stack, capsys)
    assert status == 2
    assert (
        f"{what} location s3://{bucket} ({output}) is in eu-west-1, outside stack 'test''s allowed regions "
        "us-east-1 (trainstack:allowedRegions)"
    ) in stderr
    assert stack.requests("SubmitJob") == [] and stack.jobs() == []


def test_a_bucket_in_an_allowed_region_is_accepted(stack, capsys):
    bucket = move_bucket(stack, "checkpoints_bucket", "eu-west-1")
    outputs = {**stack.outputs, "checkpoints_bucket": bucket, "allowed_regions": ["us-east-1", "eu-west-1"]}
    stack.outputs_file.write_text(json.dumps(outputs))
    status, stderr = submit_in_process(stack, capsys)
    assert status == 0, stderr
    assert len(stack.requests("SubmitJob")) == 1


def test_the_stack_buckets_in_its_own_region_pass_and_location_is_asked(stack, capsys):
    status, stderr = submit_in_process(stack, capsys)
    assert status == 0, stderr
    assert len(stack.recorded("location")) == 2  # GetBucketLocation for datasets and checkpoints
