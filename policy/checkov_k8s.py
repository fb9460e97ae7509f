"""`make policy STACK=<env>` on an EKS stack: checkov over every Kubernetes object the stack sends and the JobSets
its verbs send, each finding either fixed or accepted in policy/checkov-baseline.yaml with its reason.

The objects are the ones the offline preview registers through the Kubernetes provider (namespaces, service
accounts, RBAC, volumes, claims, admission policies, Kueue and Karpenter custom resources), and, for each team (or
the stack's own namespace when it has none), the JobSet `make render` prints, whose replicated jobs go to checkov as
the batch/v1 Jobs the JobSet controller makes of them (checkov knows Job pod templates, not JobSet's). checkov runs
from its own pinned environment (requirements/checkov.txt: it pins boto3 and tabulate below this project's pins, so
it cannot share .venv). A finding that no baseline entry accepts, a checkov that fails to run, or an accepted entry
without a reason fails the check (exit 1); the table of findings prints either way.

    python -m policy.checkov_k8s --stack eks-dev --checkov .venv-checkov/bin/checkov
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.config import ROOT, StackConfigError, load_stack_config
from infra.preview import Plan, run_program
from trainer.contract.teams import team_directories

BASELINE = Path(__file__).resolve().parent / "checkov-baseline.yaml"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
# What a JobSet's pods are rendered from: the default cluster config, as `make render` uses it.
CONFIG = "trainer/configs/llama3-8b.yaml"
OBJECT_KEYS = ("apiVersion", "kind", "metadata", "spec", "rules", "roleRef", "subjects")


@dataclass(frozen=True)
class Finding:
    check: str
    name: str
    resource: str  # checkov's `<Kind>.<namespace>.<name>`

    def accepted_by(self, entry: dict[str, str]) -> bool:
        return entry["check"] == self.check and fnmatch.fnmatchcase(self.resource, entry["resource"])


def stack_objects(plan: Plan) -> list[dict[str, Any]]:
    """Every Kubernetes object the stack registers (not Helm releases, which are charts, nor the provider)."""
    return [
        {key: r.inputs[key] for key in OBJECT_KEYS if key in r.inputs}
        for r in plan.resources
        if r.type.startswith("kubernetes:") and not r.type.startswith(("kubernetes:helm.sh/", "pulumi:"))
    ]


def rendered_jobsets(plan: Plan, outputs_file: Path) -> list[dict[str, Any]]:
    """The JobSet `make render` prints for each team of the stack (or for the stack itself without teams)."""
    teams: list[str | None] = [team.name for team in load_stack_config(plan.stack).teams] or [None]
    jobsets = []
    for team in teams:
        argv = [
            sys.executable,
            "-m",
            "trainer",
            "render",
            "--stack",
            plan.stack,
            "--outputs",
            str(outputs_file),
        ]
        argv += ["--config", CONFIG, "--image", "checkov"]
        if team is not None:
            data = f"/fsx/{team_directories(team)['fsx-datasets']}/corpus/corpus"
            argv += [
                "--team",
                team,
                "--set",
                f"data.prefixes=[{data}]",
                "--set",
                f"data.tokenizer_path={data}.json",
            ]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"make render for team {team}: {done.stderr.strip()}")
        jobsets.append(yaml.safe_load(done.stdout))
    return jobsets


def as_jobs(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """The batch/v1 Jobs the JobSet controller makes of a JobSet's replicated jobs (their specs as written)."""
    meta = jobset["metadata"]
    return [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{meta['name']}-{job['name']}", "namespace": meta["namespace"]},
            "spec": job["template"]["spec"],
        }
        for job in jobset["spec"]["replicatedJobs"]
    ]


def run_checkov(objects: list[dict[str, Any]], checkov: Path) -> list[Finding]:
    """checkov's Kubernetes framework over the objects, one file each; its failed checks."""
    with tempfile.TemporaryDirectory() as directory:
        for index, obj in enumerate(objects):
            (Path(directory) / f"{index:03d}-{obj['kind'].lower()}.yaml").write_text(yaml.safe_dump(obj))
        done = subprocess.run(
            [
                str(checkov),
                "--directory",
                directory,
                "--framework",
                "kubernetes",
                "--output",
                "json",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"checkov exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    return sorted(
        {
            Finding(failed["check_id"], failed["check_name"], failed["resource"])
            for one in reports
            for failed in one.get("results", {}).get("failed_checks", [])
        },
        key=lambda f: (f.resource, f.check),
    )


def read_baseline(path: Path = BASELINE) -> list[dict[str, str]]:
    entries = yaml.safe_load(path.read_text())["accepted"]
    unexplained = [e for e in entries if not str(e.get("reason", "")).strip()]
    if unexplained:
        raise ValueError(f"{path}: every accepted finding needs a reason; these have none: {unexplained}")
    return entries


def judge(findings: list[Finding], baseline: list[dict[str, str]]) -> tuple[list[str], list[Finding]]:
    """(report lines, findings no baseline entry accepts)."""
    lines, refused = [], []
    for finding in findings:
        entry = next((e for e in baseline if finding.accepted_by(e)), None)
        if entry is None:
            refused.append(finding)
            lines.append(f"FAILED    {finding.check} {finding.resource}: {finding.name}")
        else:
            lines.append(f"accepted  {finding.check} {finding.resource}: {entry['reason']}")
    return lines, refused


def check_stack(stack: str, checkov: Path = CHECKOV) -> tuple[list[str], list[Finding]]:
    plan = run_program(stack)
    objects = stack_objects(plan)
    if not objects:
        return [f"checkov: stack {stack} sends no Kubernetes objects"], []
    with tempfile.TemporaryDirectory() as directory:
        outputs_file = Path(directory) / "outputs.json"
        outputs_file.write_text(json.dumps(plan.outputs, default=str))
        objects += [job for jobset in rendered_jobsets(plan, outputs_file) for job in as_jobs(jobset)]
    return judge(run_checkov(objects, checkov), read_baseline())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.checkov_k8s", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True)
    parser.add_argument("--checkov", type=Path, default=CHECKOV, help="the pinned checkov (make checkov-env)")
    args = parser.parse_args(argv)
    if not args.checkov.is_file():
        print(
            f"checkov: {args.checkov} is missing; make policy installs it (requirements/checkov.txt)",
            file=sys.stderr,
        )
        return 2
    try:
        lines, refused = check_stack(args.stack, args.checkov)
    except StackConfigError as error:
        print(f"checkov: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if refused:
        print(
            f"checkov: {len(refused)} finding(s) neither fixed nor accepted in {BASELINE.relative_to(ROOT)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
