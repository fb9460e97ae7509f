"""What a GPU node runs at boot before it joins the cluster: the host user data of the launch template.

Batch launches nodes from the ECS-optimized GPU AMI; the ECS agent (`ecs.service`) starts after cloud-init's final
stage, where this script runs, and reads `/etc/ecs/ecs.config` when it starts. So the script can still configure the
agent, and it decides whether the node joins at all:

- EFA kernel driver: the ECS GPU AMI's build source installs none (aws/amazon-ecs-ami scripts/al2023/gpu: the
  NVIDIA driver and DCGM), so the boot does not assume one: the installer runs when `modinfo efa` finds no module;
- the Lustre client, and FSx mounted at /fsx (the container's /fsx is a bind mount of it);
- the agent's stop timeout above the trainer's SIGTERM grace, so a stopped job saves before SIGKILL;
- any failure: the agent is masked and the node shuts down, which terminates it (the launch template's
  instance-initiated shutdown behaviour). A node without /fsx would otherwise join and write checkpoints to its
  root volume, deleted with the instance.
"""

from __future__ import annotations

import base64
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from trainer.contract.container import (
    CHECKPOINTS_DIR,
    CONTAINER_UID,
    DATASETS_DIR,
    FSX_MOUNT,
    STOP_TIMEOUT_MARGIN_SECONDS,
)
from trainer.contract.image import image_pins

ECS_CONFIG = "/etc/ecs/ecs.config"
FSTAB = "/etc/fstab"
# A fixed MIME boundary keeps the template (and its version) stable between runs.
MIME_BOUNDARY = "==trainstack-node=="


def ecs_stop_timeout_seconds(stop_grace_seconds: int) -> int:
    """ECS_CONTAINER_STOP_TIMEOUT: SIGTERM -> SIGKILL (default 30 s), above the trainer's stop grace."""
    return stop_grace_seconds + STOP_TIMEOUT_MARGIN_SECONDS


def node_script(fsx_dns_name: str, fsx_mount_name: str, stop_grace_seconds: int) -> str:
    """The shell script part of the user data."""
    efa_installer = image_pins()["EFA_INSTALLER_VERSION"]
    stop_timeout = ecs_stop_timeout_seconds(stop_grace_seconds)
    # ecs.service is ordered After=cloud-final.service (aws/amazon-ecs-init packaging/amazon-linux-ami/ecs.service):
    # it starts even when this script fails, so the failure path masks it before shutting the node down.
    return f"""#!/bin/bash
set -euxo pipefail
bootstrap_failed() {{
  echo "trainstack: node bootstrap failed (line $1); the node will not join the cluster" >&2
  systemctl mask --runtime ecs.service || true
  systemctl stop --no-block ecs.service || true
  shutdown -h now
}}
trap 'bootstrap_failed $LINENO' ERR

# ECS agent configuration, read when the agent starts (after this script): Amazon ECS developer guide,
# "Amazon ECS container agent configuration". SIGTERM -> SIGKILL must outlast the trainer's save on SIGTERM.
echo "ECS_CONTAINER_STOP_TIMEOUT={stop_timeout}s" >> {ECS_CONFIG}

# Nothing says the ECS GPU AMI carries the EFA kernel module (aws/amazon-ecs-ami installs none): install it where
# `modinfo efa` finds none. The image brings libfabric and aws-ofi-nccl (same installer version).
if ! modinfo efa > /dev/null 2>&1; then
  curl -fsSL --retry 5 -o /tmp/aws-efa-installer.tar.gz https://efa-installer.amazonaws.com/aws-efa-installer-{efa_installer}.tar.gz
  tar -xzf /tmp/aws-efa-installer.tar.gz -C /tmp
  (cd /tmp/aws-efa-installer && ./efa_installer.sh --yes --minimal)
fi

dnf install -y lustre-client
mkdir -p {FSX_MOUNT}
# flock: locks coherent across all client nodes (mount.lustre(8); localflock would lock per node), as the FSx for
# Lustre User Guide's own mount command has it ("Mounting from an Amazon EC2 instance": -o relatime,flock). A run's
# lock on its directory needs it (trainer/launch/run_lock.py); the preflight refuses a mount without it.
echo "{fsx_dns_name}@tcp:/{fsx_mount_name} {FSX_MOUNT} lustre defaults,noatime,flock,_netdev 0 0" >> {FSTAB}
mount {FSX_MOUNT}
# A bind mount of an empty directory would look mounted inside the container: require Lustre here.
findmnt --target {FSX_MOUNT} --types lustre > /dev/null
# The image runs as a non-root user (image/Dockerfile USER): it writes runs and data below these two (the data
# repository associations' roots), which Lustre creates owned by root.
mkdir -p {DATASETS_DIR} {CHECKPOINTS_DIR}
chown {CONTAINER_UID}:{CONTAINER_UID} {DATASETS_DIR} {CHECKPOINTS_DIR}
"""


def node_user_data(fsx_dns_name: str, fsx_mount_name: str, stop_grace_seconds: int) -> str:
    """Base64 MIME multi-part user data (Batch merges it with its own)."""
    message = MIMEMultipart(boundary=MIME_BOUNDARY)
    message.attach(MIMEText(node_script(fsx_dns_name, fsx_mount_name, stop_grace_seconds), "x-shellscript"))
    return base64.b64encode(message.as_string().encode()).decode()
