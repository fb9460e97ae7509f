"""What a team is called where, shared by the stack (infra/teams.py) and `make train TEAM=` (trainer/jobs/teams.py)."""

from __future__ import annotations

# The role's principal tag, the job tag the role must set, and the cost-allocation tag.
TEAM_TAG = "team"
# Each team's datasets and checkpoints live under teams/<name>/ of the stack's buckets.
TEAMS_PREFIX = "teams/"


def team_prefix(team: str) -> str:
    return f"{TEAMS_PREFIX}{team}/"
