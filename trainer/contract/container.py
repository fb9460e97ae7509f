"""The container contract, from image/container.env: paths inside every training container and the command a
job runs by default. infra/ (job definition, host user data), trainer/jobs/ (submit, upload) and the preflight
read these names; the entrypoint reads the same file."""

from __future__ import annotations

from trainer.contract.image import container_environment

_SETTINGS = container_environment()

FSX_MOUNT: str = _SETTINGS["TRAINSTACK_FSX_MOUNT"]  # the same path on the host and in the container
DATASETS_DIR: str = _SETTINGS["TRAINSTACK_DATASETS_DIR"]  # linked to the datasets bucket (auto-import)
# Linked to the checkpoints bucket (auto-export).
CHECKPOINTS_DIR: str = _SETTINGS["TRAINSTACK_CHECKPOINT_ROOT"]
# The image's user and group (image/Dockerfile USER): a pod runs as them (trainer/jobs/jobset.py), not as root.
CONTAINER_UID: int = int(_SETTINGS["TRAINSTACK_UID"])
DEFAULT_CONFIG: str = _SETTINGS["TRAINSTACK_DEFAULT_CONFIG"]  # relative to the image's working directory
DEFAULT_COMMAND: list[str] = ["train", "--config", DEFAULT_CONFIG]
# After SIGTERM, how long the ranks get to save and exit before the supervisor kills them.
STOP_GRACE_SECONDS: int = int(_SETTINGS["TRAINSTACK_STOP_GRACE_SECONDS"])
# Every job's environment names its image (trainer/jobs/submit.py sets them): the model version record of each
# checkpoint it publishes carries both (trainer/checkpoint/version.py).
IMAGE_TAG_ENV = "TRAINSTACK_IMAGE_TAG"
IMAGE_DIGEST_ENV = "TRAINSTACK_IMAGE_DIGEST"
# Batch sets it in each child of an array job, from 0 (Batch user guide, "AWS Batch job environment variables"):
# a data shard's (trainer/jobs/data.py) or a sweep worker's (trainer/sweep/worker.py) index.
ARRAY_INDEX_ENV = "AWS_BATCH_JOB_ARRAY_INDEX"
# The submitter's clock at submission: where a run's ledger starts its queue wait (trainer/cost/ledger.py).
SUBMITTED_AT_ENV = "TRAINSTACK_SUBMITTED_AT"
# What only the moment of submission knows (an ECR lookup, the clock): `make render` prints the object without them
# and `submit` adds them to exactly that object, nothing else.
SUBMISSION_ENV: tuple[str, ...] = (IMAGE_DIGEST_ENV, SUBMITTED_AT_ENV)
# What the orchestrator waits after SIGTERM beyond that grace before SIGKILL (the ECS agent's stop timeout on Batch
# nodes, a pod's terminationGracePeriodSeconds on EKS): time for the supervisor's kill and the container's exit.
STOP_TIMEOUT_MARGIN_SECONDS = 60
# In a JobSet's pods (trainer/jobs/jobset.py): JobSet's own name variable, and the run's node count, which the
# submit tool sets (the launcher's rendezvous, the ledger's node-hours).
JOBSET_NAME_ENV = "JOBSET_NAME"
NUM_NODES_ENV = "TRAINSTACK_NUM_NODES"
# What the run's ledger prices its node-hours at (trainer/cost/ledger.py local_rate, one of trainer/cost/pricing.py
# PURCHASE_OPTIONS; unset it assumes on-demand): a Batch job definition says what its compute environment buys
# (infra/cluster.py), a JobSet's pods what the EKS stack's GPU nodes are bought as (its purchase_option output).
PURCHASE_OPTION_ENV = "TRAINSTACK_PURCHASE_OPTION"

# A stack's job definition that names the placeholder image (no `trainstack:image`) is called `<name>-template`
# (infra/cluster.py template_name); the verbs register the revisions that run, with a pushed image, under
# `<name>-run` (trainer/jobs/submit.py job_definition_for). Pulumi never manages that family, so replacing the
# template leaves them in service: the provider's delete deregisters every ACTIVE revision of the name
# (terraform-provider-aws PR 34281, resourceJobDefinitionDelete), and a fixed name is deleted before it is replaced
# (pulumi-terraform-bridge provider.go, nameRequiresDeleteBeforeReplace).
TEMPLATE_SUFFIX = "-template"
RUNNABLE_SUFFIX = "-run"


def runnable_definition_name(name: str) -> str:
    """Where revisions that run are registered: `<x>-run` for a stack template `<x>-template`; a definition the stack
    registered with its image (`trainstack:image`) takes them under its own name."""
    return name.removesuffix(TEMPLATE_SUFFIX) + RUNNABLE_SUFFIX if name.endswith(TEMPLATE_SUFFIX) else name
