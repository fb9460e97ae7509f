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
DEFAULT_CONFIG: str = _SETTINGS["TRAINSTACK_DEFAULT_CONFIG"]  # relative to the image's working directory
DEFAULT_COMMAND: list[str] = ["train", "--config", DEFAULT_CONFIG]
# After SIGTERM, how long the ranks get to save and exit before the supervisor kills them.
STOP_GRACE_SECONDS: int = int(_SETTINGS["TRAINSTACK_STOP_GRACE_SECONDS"])
# What the orchestrator waits after SIGTERM beyond that grace before SIGKILL (the ECS agent's stop timeout on Batch
# nodes, a pod's terminationGracePeriodSeconds on EKS): time for the supervisor's kill and the container's exit.
STOP_TIMEOUT_MARGIN_SECONDS = 60
