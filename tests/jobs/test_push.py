"""`make push STACK=<env>`: the docker commands for the stack's ECR repository, and immutable tags respected."""

from __future__ import annotations

from trainer.__main__ import main as trainer_main

from .conftest import IMAGE_TAG, Stack


def test_push_logs_in_to_the_stack_registry_and_pushes_the_commit_tag(stack: Stack, capsys):
    outputs = ["--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(["push", *outputs, "--tag", "cafef00dcafe", "--dry-run"]) == 0
    login, tag, push = capsys.readouterr().out.splitlines()
    registry, repository = stack.outputs["ecr_repository_url"].split("/", 1)
    assert login == f"docker login --username AWS --password-stdin {registry}"
    assert tag == f"docker tag trainstack:cafef00dcafe {registry}/{repository}:cafef00dcafe"
    assert push == f"docker push {registry}/{repository}:cafef00dcafe"


def test_push_skips_a_tag_already_in_the_immutable_registry(stack: Stack, capsys):
    outputs = ["--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(["push", *outputs, "--tag", IMAGE_TAG]) == 0
    assert "is already in the registry (tags are immutable)" in capsys.readouterr().out
