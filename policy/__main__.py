"""Serve the pack to the Pulumi engine: `pulumi preview|up --policy-pack policy` runs `python policy/`.

Constructing `PolicyPack` starts the analyzer's gRPC server, prints its port and blocks until the engine is done.
"""

import sys
from pathlib import Path

# The engine runs this directory as a script; import the pack as the package `policy` (it also reads `infra`).
ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "policy")]

from pulumi_policy import PolicyPack  # noqa: E402

from policy.pack import ENFORCEMENT_LEVEL, PACK_NAME, POLICIES  # noqa: E402

PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=ENFORCEMENT_LEVEL)
