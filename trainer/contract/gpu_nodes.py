"""What an EKS stack's GPU nodes carry and the pods meant for them must match (infra/karpenter.py, the JobSet).

The GPU nodes are tainted, so only pods that tolerate the taint land there (Kubernetes docs, "Taints and
Tolerations": a NoSchedule taint keeps every pod without a matching toleration off the node). Without it a pending
controller pod could make Karpenter start a p5 for itself, and a controller replica placed on a GPU node would keep
that node from ever being empty, so from being removed.
"""

from __future__ import annotations

GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_NODE_TAINT = {"key": GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
# What the training pods and the device plugins tolerate (any value of the key).
GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
