"""The object a stack's orchestrator receives for a submission, built with no AWS call: `make render` prints it
and `make train` sends it.

Batch  the SubmitJob request (JSON); at submission its jobDefinition becomes the revision that names the image
       (trainer/jobs/submit.py job_definition_for), the one field render cannot know offline.
EKS    the JobSet (trainer/jobs/jobset.py), with the stack config's stop grace and job timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.aws.outputs import StackOutputs
from trainer.contract.container import CHECKPOINTS_DIR, STOP_GRACE_SECONDS
from trainer.contract.stack import DEFAULT_JOB_TIMEOUT_HOURS, ROOT, stack_job_limits
from trainer.contract.teams import RUN_TAG, STACK_TAG, run_path
from trainer.jobs.jobset import JobSettings, RenderError, jobset_manifest
from trainer.jobs.teams import team_submit_arguments


@dataclass(frozen=True)
class Submission:
    run: str
    nodes: int
    gpus_per_node: int
    image: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    planned_layout: str | None = None  # what the planner chose for the config's `auto` keys
    team: str | None = None  # on a stack with teams: the share and `team` tag (trainer/jobs/teams.py)

    @property
    def run_dir(self) -> str:
        """/fsx/checkpoints/<run>, or a team's /fsx/checkpoints/teams/<team>/<run> (trainer/contract/teams.py)."""
        return f"{CHECKPOINTS_DIR}/{self.run_key}"

    @property
    def run_key(self) -> str:
        """The run's prefix in the checkpoints bucket (FSx exports /fsx/checkpoints to the bucket's root)."""
        return run_path(self.run, self.team)


def job_settings(stack: str) -> JobSettings:
    """The stop grace and job timeout from `Pulumi.<stack>.yaml` (make preview-offline validates them), or the
    stack config's defaults for a stack with no file here (an OUTPUTS file from elsewhere)."""
    if not (ROOT / f"Pulumi.{stack}.yaml").is_file():
        return JobSettings(STOP_GRACE_SECONDS, DEFAULT_JOB_TIMEOUT_HOURS)
    try:
        stop_grace, timeout_hours = stack_job_limits(stack, STOP_GRACE_SECONDS)
    except ValueError as error:
        raise RenderError(
            f"Pulumi.{stack}.yaml: {error}; make preview-offline STACK={stack} names the key"
        ) from None
    return JobSettings(stop_grace, timeout_hours)


def batch_job_request(submission: Submission, outputs: StackOutputs, job_definition: str) -> dict[str, Any]:
    """The keyword arguments of Batch SubmitJob for `submission` on `job_definition`."""
    environment = [{"name": k, "value": v} for k, v in submission.environment.items()]
    team = team_submit_arguments(submission.team)
    return {
        "jobName": submission.run,
        "jobQueue": outputs["job_queue"],
        "jobDefinition": job_definition,
        "nodeOverrides": {
            "numNodes": submission.nodes,
            "nodePropertyOverrides": [
                {
                    "targetNodes": "0:",
                    "containerOverrides": {"command": submission.command, "environment": environment},
                }
            ],
        },
        "tags": {RUN_TAG: submission.run, STACK_TAG: outputs.stack, **team.pop("tags", {})},
        "propagateTags": True,
        **team,
    }


def jobset_for(submission: Submission, outputs: StackOutputs, settings: JobSettings) -> dict[str, Any]:
    return jobset_manifest(
        submission.run,
        submission.nodes,
        submission.image,
        submission.command,
        submission.environment,
        outputs,
        settings,
        submission.team,
    )
