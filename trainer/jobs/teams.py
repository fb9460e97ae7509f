"""`make train STACK=<env> TEAM=<name>` on a stack shared by teams (infra/teams.py, docs/security.md#teams).

A stack with teams has a fair-share GPU queue: Batch refuses a job without a share identifier there (Batch API
SubmitJob, `shareIdentifier`: required on a queue with a scheduling policy) or without a scheduling priority
(`FAIR_SHARE_PRIORITY`), and the team roles may submit only with their own share and `team` tag. A stack without
teams takes no TEAM. Batch has no per-share GPU ceiling, so the team's `gpuQuota` is checked here against this
job's GPUs. Every job carries a `team` tag from its submission on (a team's name, or the stack's own STACK_TEAM), so
no team role can tag it afterwards (infra/teams.py).

On an EKS stack with teams the same TEAM= picks the namespace a job goes to and is found in (`job_namespace`):
the team's, where its LocalQueue feeds its ClusterQueue and its service account reads its S3 prefix
(infra/eks_teams.py).
"""

from __future__ import annotations

from typing import Any

from trainer.aws.outputs import StackError, StackOutputs
from trainer.contract.teams import STACK_TEAM, TEAM_TAG


def team_name_problems(outputs: StackOutputs, team: str | None) -> list[str]:
    """TEAM= against the stack's teams: required on a stack with teams, one of them, and absent on one without."""
    listed = outputs.values.get("teams")
    teams = [str(t) for t in listed] if isinstance(listed, list) else []
    if not teams:
        return (
            [f"TEAM={team}: stack {outputs.stack!r} has no teams (trainstack:teams); leave TEAM out"]
            if team
            else []
        )
    if team is None:
        return [f"stack {outputs.stack!r} is shared by teams {', '.join(teams)}: say which with TEAM=<name>"]
    if team not in teams:
        return [f"TEAM={team}: not a team of stack {outputs.stack!r}; its teams are {', '.join(teams)}"]
    return []


def team_problems(outputs: StackOutputs, team: str | None, nodes: int) -> list[str]:
    """TEAM= for a job of `nodes` nodes: a team of the stack, with the GPUs within its quota."""
    if problems := team_name_problems(outputs, team):
        return problems
    if team is None:
        return []
    quotas = outputs.values.get("team_gpu_quotas")
    quota: int | None = (int(quotas.get(team, 0)) if isinstance(quotas, dict) else 0) or None
    gpus = nodes * outputs.gpus_per_node
    if quota is not None and gpus > quota:
        return [
            f"NODES={nodes}: {gpus} GPUs is over team {team!r}'s quota of {quota} (trainstack:teams gpuQuota); "
            f"ask for at most {quota // outputs.gpus_per_node} nodes"
        ]
    return []


# A job on a fair-share queue needs a scheduling priority, from its job definition or the submission: Batch answers
# 400 "Either schedulingPriority in job definition or schedulingPriorityOverride should be specified"
# (nextflow-io/nextflow pull 3505, which then sends 0 by default; meta-pytorch/torchx pull 544 likewise). The stack's
# definitions set none, and `make train` re-registers them per image, so every team job carries it. One value for
# every job: priority orders jobs only within one share (botocore batch model, SubmitJob.schedulingPriorityOverride,
# 0-9999), and the teams' shares are what divides the queue.
FAIR_SHARE_PRIORITY = 0


def team_tags(team: str | None) -> dict[str, str]:
    """The `team` tag of a job: the team's name, or the stack's own value for a job of no team."""
    return {TEAM_TAG: team or STACK_TEAM}


def team_submit_arguments(team: str | None) -> dict[str, Any]:
    """SubmitJob arguments for a job: every job's `team` tag, and a team's fair-share identifier and priority."""
    if not team:
        return {"tags": team_tags(team)}
    return {
        "shareIdentifier": team,
        "schedulingPriorityOverride": FAIR_SHARE_PRIORITY,
        "tags": team_tags(team),
    }


def job_namespace(outputs: StackOutputs, team: str | None) -> str:
    """Where an EKS stack's JobSets of `team` live: the team's namespace (stack output `team_namespaces`,
    infra/eks_teams.py), or the stack's own for a stack without teams."""
    if not team:
        return str(outputs["k8s_namespace"])
    namespaces = outputs.values.get("team_namespaces")
    if not isinstance(namespaces, dict) or team not in namespaces:
        raise StackError(
            f"stack {outputs.stack}: output team_namespaces has no namespace for team {team!r}; run make up "
            "with this checkout"
        )
    return str(namespaces[team])
