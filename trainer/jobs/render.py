"""`python -m trainer render --stack <env>` (`make render STACK=<env>`): print what `make train` would send.

The JobSet as YAML on an EKS stack, the SubmitJob request as JSON on a Batch stack; no AWS call. The outputs come
from OUTPUTS=file.json, else `pulumi stack output`, else, when the stack does not exist (no Pulumi CLI, or the
stack was never brought up), from the offline preview of `Pulumi.<env>.yaml` (infra/preview.py), which says so on
stderr. The same checks as `make train` that need no AWS call run first (layout, run name, TEAM= and its data).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from trainer.aws.outputs import StackError, StackOutputs, checked_outputs, load_outputs
from trainer.contract.container import DEFAULT_CONFIG
from trainer.contract.stack import ROOT
from trainer.jobs.jobset import RenderError
from trainer.jobs.request import batch_job_request, job_settings, jobset_for
from trainer.jobs.submit import SubmitError, eks_problems, git_commit, plan


def render_outputs(stack: str, outputs_file: str | None) -> StackOutputs:
    """The stack's outputs, or its offline preview's when the stack has none to give."""
    if outputs_file:
        return load_outputs(stack, outputs_file)
    try:
        return load_outputs(stack)
    except StackError as error:
        if not (ROOT / f"Pulumi.{stack}.yaml").is_file():
            raise
        reason = error
    print(f"render: {reason}; using the offline preview of Pulumi.{stack}.yaml", file=sys.stderr)
    # Pulumi under mocks, in its own process: the trainer imports nothing from infra/.
    preview = [sys.executable, "-m", "infra.preview", "--stack", stack, "--format", "outputs"]
    result = subprocess.run(preview, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(f"make preview-offline STACK={stack} failed: {result.stderr.strip()}")
    source = f"the offline preview of Pulumi.{stack}.yaml"
    return checked_outputs(stack, json.loads(result.stdout), source)


def render(outputs: StackOutputs, submission_args: argparse.Namespace) -> str:
    tag = submission_args.image or git_commit()
    if not tag:
        raise SubmitError(["IMAGE is not given and this is not a git checkout; give IMAGE=<tag>"])
    submission, _ = plan(
        submission_args.config,
        submission_args.overrides,
        outputs,
        submission_args.nodes,
        tag,
        submission_args.run,
        submission_args.team,
    )
    if outputs.orchestrator == "eks":
        if problems := eks_problems(submission, outputs):
            raise SubmitError(problems)
        manifest = jobset_for(submission, outputs, job_settings(outputs.stack))
        return yaml.safe_dump(manifest, sort_keys=False)
    request = batch_job_request(submission, outputs, outputs["job_definition"])
    return json.dumps(request, indent=2) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="the stack whose orchestrator would receive the job")
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--config", type=Path, default=Path(DEFAULT_CONFIG))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--nodes", type=int, help="nodes for this job (default: the stack's node count)")
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument("--run", help="run name (default: the config's name)")
    parser.add_argument("--team", help="on a stack shared by teams: the team the job is for")


def main(args: argparse.Namespace) -> int:
    try:
        outputs = render_outputs(args.stack, args.outputs)
        text = render(outputs, args)
    except (StackError, SubmitError, RenderError) as error:
        print(f"render: {error}", file=sys.stderr)
        return 2
    if outputs.orchestrator == "batch":
        print(
            "render: at submission jobDefinition becomes the revision of it that names the image",
            file=sys.stderr,
        )
    sys.stdout.write(text)
    return 0
