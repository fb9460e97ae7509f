"""`python -m trainer push --stack <env>`: push the locally built image to the stack's ECR repository under an
immutable tag (the git commit `make image` tagged it with), then give every job definition the stack exports a
revision with that image: the Spot and data queues' single-node definitions as well as the multi-node one, whose
placeholder image (`:latest`, infra/cluster.py) an immutable repository never receives. Submit to the printed
revisions: a later `pulumi up` may register a newer one naming `:latest` again."""

from __future__ import annotations

import argparse
import base64
import shlex
import subprocess
import sys

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.jobs.submit import SubmitError, git_commit, image_digest, job_definitions_for

LOCAL_REPOSITORY = "trainstack"


def docker_login(outputs: StackOutputs) -> tuple[list[str], str]:
    """The `docker login` command for the stack's registry and the password to feed it on stdin."""
    token = client("ecr", outputs.region).get_authorization_token()["authorizationData"][0]
    user, password = base64.b64decode(token["authorizationToken"]).decode().split(":", 1)
    registry = outputs["ecr_repository_url"].split("/", 1)[0]
    return ["docker", "login", "--username", user, "--password-stdin", registry], password


def push_commands(outputs: StackOutputs, tag: str) -> list[list[str]]:
    remote = f"{outputs['ecr_repository_url']}:{tag}"
    return [["docker", "tag", f"{LOCAL_REPOSITORY}:{tag}", remote], ["docker", "push", remote]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--tag", help="image tag (default: this git commit, as `make image` tags it)")
    parser.add_argument("--dry-run", action="store_true", help="print the docker commands; push nothing")


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
    except StackError as error:
        print(f"push: {error}", file=sys.stderr)
        return 2
    tag = args.tag or git_commit()
    if not tag:
        print("push: not a git checkout; give TAG=<tag>", file=sys.stderr)
        return 2
    if image_digest(outputs, tag) is not None:
        print(f"{outputs['ecr_repository_url']}:{tag} is already in the registry (tags are immutable)")
        return register_definitions(outputs, tag)
    login, password = docker_login(outputs)
    commands = push_commands(outputs, tag)
    if args.dry_run:
        for command in (login, *commands):
            print(shlex.join(command))
        return 0
    local = subprocess.run(
        ["docker", "image", "inspect", f"{LOCAL_REPOSITORY}:{tag}"], capture_output=True, check=False
    )
    if local.returncode != 0:
        print(
            f"push: no local image {LOCAL_REPOSITORY}:{tag}; build it first with make image", file=sys.stderr
        )
        return 2
    subprocess.run(login, input=password, text=True, check=True)
    for command in commands:
        subprocess.run(command, check=True)
    print(f"pushed {outputs['ecr_repository_url']}:{tag}")
    return register_definitions(outputs, tag)


def register_definitions(outputs: StackOutputs, tag: str) -> int:
    """Point every exported job definition at the pushed tag (a new revision only where none has it yet)."""
    try:
        revisions = job_definitions_for(f"{outputs['ecr_repository_url']}:{tag}", outputs)
    except SubmitError as error:
        print(f"push: {'; '.join(error.problems)}", file=sys.stderr)
        return 2
    for output, arn in revisions.items():
        print(f"  {output}: {arn}")
    return 0
