"""trainer/contract/outputs.py: which outputs a stack must export depends on its `orchestrator` output."""

from __future__ import annotations

import pytest

from trainer.contract.outputs import (
    BATCH_OUTPUTS,
    EKS_OUTPUTS,
    STACK_OUTPUTS,
    missing_outputs,
    orchestrator,
    required_outputs,
)

SHARED = [name for name in STACK_OUTPUTS if name not in BATCH_OUTPUTS]


def test_a_stack_without_the_output_is_a_batch_stack():
    outputs = dict.fromkeys(STACK_OUTPUTS, "x")
    assert orchestrator(outputs) == "batch" and missing_outputs(outputs) == []


def test_a_batch_stack_must_export_its_queue_and_job_definition():
    outputs = {"orchestrator": "batch", **dict.fromkeys(SHARED, "x")}
    assert missing_outputs(outputs) == ["job_queue", "job_definition"]
    assert required_outputs(outputs) == STACK_OUTPUTS


def test_an_eks_stack_needs_the_cluster_outputs_not_the_batch_ones():
    outputs = {"orchestrator": "eks", **dict.fromkeys(SHARED, "x")}
    assert missing_outputs(outputs) == list(EKS_OUTPUTS)
    outputs.update(dict.fromkeys(EKS_OUTPUTS, "x"))
    assert missing_outputs(outputs) == [] and not set(BATCH_OUTPUTS) & set(required_outputs(outputs))


def test_an_unknown_orchestrator_is_named():
    with pytest.raises(ValueError, match=r"stack output orchestrator = 'slurm': expected one of batch, eks"):
        orchestrator({"orchestrator": "slurm"})
