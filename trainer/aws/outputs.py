"""A stack's outputs: from `pulumi stack output --json --stack <env>`, or from a file (CI pipelines, tests)."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainer.contract.outputs import missing_outputs, orchestrator


class StackError(RuntimeError):
    """The stack's outputs cannot be read or lack what a command needs."""


@dataclass(frozen=True)
class StackOutputs:
    stack: str
    values: dict[str, object]

    def __getitem__(self, name: str) -> str:
        return str(self.values[name])

    @property
    def orchestrator(self) -> str:
        """`batch` or `eks` (trainer/contract/outputs.py); load_outputs has checked the value."""
        return orchestrator(self.values)

    @property
    def region(self) -> str:
        return self["region"]

    @property
    def node_count(self) -> int:
        return self._count("node_count")

    @property
    def gpus_per_node(self) -> int:
        return self._count("gpus_per_node")

    def _count(self, name: str) -> int:
        value = self.values[name]
        if not isinstance(
            value, int | float | str
        ):  # JSON gives any value; the stack exports these as numbers
            raise StackError(f"stack {self.stack}: output {name} = {value!r} is not a number")
        return int(value)

    @property
    def ecr_repository_name(self) -> str:
        return self["ecr_repository_url"].split("/", 1)[1]


def load_outputs(stack: str, outputs_file: str | Path | None = None) -> StackOutputs:
    """Read and check the outputs; every problem is one StackError naming the stack and what to do."""
    if not stack:
        raise StackError("no stack given: set STACK=<env> (dev, staging, prod, eks-dev)")
    if outputs_file:
        path = Path(outputs_file)
        source = str(path)
        try:
            text = path.read_text()
        except OSError as error:
            raise StackError(f"OUTPUTS={path}: cannot read it ({error.strerror})") from None
    else:
        source = f"pulumi stack output --json --stack {stack}"
        if shutil.which("pulumi") is None:
            raise StackError(
                "the Pulumi CLI is not installed: install it (https://www.pulumi.com/docs/install/) "
                "or give the outputs as a file, OUTPUTS=path.json"
            )
        result = subprocess.run(source.split(), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(f"`{source}` failed: {result.stderr.strip() or result.stdout.strip()}")
        text = result.stdout
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise StackError(f"{source}: not JSON ({error.msg} at line {error.lineno})") from None
    return checked_outputs(stack, values, source)


def checked_outputs(stack: str, values: object, source: str) -> StackOutputs:
    """`values` as a stack's outputs, once they hold every name its orchestrator needs."""
    if not isinstance(values, dict):
        raise StackError(f"{source}: expected a JSON object of stack outputs, got {type(values).__name__}")
    try:
        missing = missing_outputs(values)
    except ValueError as error:
        raise StackError(f"{source}: {error}") from None
    if missing:
        raise StackError(
            f"{source}: stack {stack!r} lacks the outputs {', '.join(missing)}; "
            "run `make up STACK=" + stack + "` with this checkout's infra/ so the stack exports them"
        )
    return StackOutputs(stack, values)
