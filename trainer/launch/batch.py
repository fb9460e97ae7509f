"""AWS Batch multi-node parallel jobs: the node variables Batch sets, turned into a torchrun rendezvous.

Static rendezvous: the main node is node rank 0 and hosts the store. Without Batch variables (a single-node Batch
job, `docker run`, a workstation) the rendezvous is torchrun's standalone one. The launcher (trainer/launch/node.py)
asks this module; the supervisor and torchrun's command line are trainer/distributed/torchrun.py's, shared by every
backend.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

from trainer.distributed.torchrun import LaunchError, Rendezvous

NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_INDEX = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_NODE_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"


def _int_variable(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise LaunchError(f"{name} is not set; AWS Batch sets it on every node of a multi-node job")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer node index/count") from None


def primary_address() -> str:
    """This host's address on its default route (no packet is sent: UDP connect only picks the interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def rendezvous_from_env(
    env: Mapping[str, str], own_address: Callable[[], str] = primary_address
) -> Rendezvous:
    if NODE_INDEX not in env:
        return Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    index, nnodes, main = (_int_variable(env, name) for name in (NODE_INDEX, NUM_NODES, MAIN_NODE_INDEX))
    if nnodes < 1 or not (0 <= index < nnodes and 0 <= main < nnodes):
        raise LaunchError(
            f"inconsistent Batch node variables: {NODE_INDEX}={index}, {NUM_NODES}={nnodes}, "
            f"{MAIN_NODE_INDEX}={main} (indices must lie in 0..{nnodes - 1})"
        )
    if nnodes == 1:
        return Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    # torchrun's static rendezvous hosts its store on node rank 0: make that the Batch main node.
    node_rank = (index - main) % nnodes
    if index == main:
        return Rendezvous(nnodes, node_rank, own_address())
    address = env.get(MAIN_NODE_ADDRESS)
    if not address:
        raise LaunchError(
            f"{MAIN_NODE_ADDRESS} is not set on child node {index}; Batch sets it on child nodes"
        )
    return Rendezvous(nnodes, node_rank, address)
