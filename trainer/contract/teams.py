"""What a team is called where, shared by the stack (infra/teams.py, infra/eks_teams.py) and `make train TEAM=`
(trainer/jobs/teams.py).

A team's runs live under `teams/<name>/` of the checkpoints bucket and `/fsx/checkpoints/teams/<name>/` (the
bucket's root is /fsx/checkpoints: infra/lustre.py), its datasets under `teams/<name>/` of the datasets bucket and
`/fsx/datasets/teams/<name>/`: the prefixes its role may read and write, so it reads its own checkpoints through S3
and two teams' runs of one name never share (or resume) one directory.
"""

from __future__ import annotations

# The role's principal tag, the job tag the role must set, and the cost-allocation tag.
TEAM_TAG = "team"
# Every tag a training job gets at submission (trainer/jobs/request.py), and so all a team role may set
# (infra/teams.py).
RUN_TAG, STACK_TAG = "trainstack:run", "trainstack:stack"
JOB_TAG_KEYS = (RUN_TAG, STACK_TAG, TEAM_TAG)
# The `team` tag of every job the stack's verbs submit for no team (data preparation, a stack without teams): no
# team is called this (team names are a-z and 0-9: infra/config.py), so no team role may set or stop it.
STACK_TEAM = "_stack"
# The service account a team's pods run as in its namespace on EKS: its Pod Identity association gives them the
# team's S3 read role (infra/eks_teams.py), and a team's JobSet names it (trainer/jobs/jobset.py).
TEAM_SERVICE_ACCOUNT = "trainer"
# Each team's datasets and checkpoints live under teams/<name>/ of the stack's buckets.
TEAMS_PREFIX = "teams/"


def team_prefix(team: str) -> str:
    return f"{TEAMS_PREFIX}{team}/"


def team_namespace(team: str) -> str:
    """A team's Kubernetes namespace on EKS, `team-<name>`: a team named like a system namespace (kube-system)
    cannot land in it."""
    return f"team-{team}"


def team_root(team: str | None) -> str:
    """The part of a bucket (and of /fsx) that is `team`'s: `teams/<team>/`, or the root ("") for no team."""
    return team_prefix(team) if team and team != STACK_TEAM else ""


def run_path(run: str, team: str | None) -> str:
    """Where a run lives below /fsx/checkpoints and the checkpoints bucket's root: `<run>`, or a team's
    `teams/<team>/<run>`."""
    return f"{team_root(team)}{run}"


def job_team(tags: dict[str, str] | None) -> str | None:
    """The team whose job this is, from its tags; None for the stack's own jobs."""
    team = (tags or {}).get(TEAM_TAG)
    return team if team and team != STACK_TEAM else None


# A team's part of /fsx on EKS: each of its two directories is its own volume, a Lustre fileset mount of that
# directory alone (infra/eks_teams.py), at the same path in the container as on the whole file system, so the
# container contract's paths hold and nothing above them is mounted. (claim name, directory below /fsx.)
TEAM_CLAIMS = (("fsx-datasets", "datasets"), ("fsx-checkpoints", "checkpoints"))


def team_directories(team: str) -> dict[str, str]:
    """claim -> the team's directory below /fsx (`datasets/teams/<team>`, `checkpoints/teams/<team>`)."""
    return {claim: f"{top}/{team_prefix(team).rstrip('/')}" for claim, top in TEAM_CLAIMS}
