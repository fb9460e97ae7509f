"""What an EKS stack's GPU nodes carry and the pods meant for them must match (infra/karpenter.py, the JobSet), and how
long a job's nodes may take to start before Kueue gives up on them (the planner prices it).

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

# Kueue evicts and requeues an admitted job whose pods are not all ready within this long (its waitForPodsReady
# timeout, infra/cluster_software.py): the most node start-up one attempt of a job pays on an EKS stack.
PODS_READY_TIMEOUT_MINUTES = 30

# A node whose preflight failed taints itself with this before it leaves (trainer/preflight/quarantine.py): no pod
# tolerates it, so a JobSet restart cannot land there again; the admission policy in infra/node_quarantine.py lets a
# job's pod add only this, and only to the node it runs on.
QUARANTINE_TAINT = {"key": "trainstack.dev/preflight-failed", "value": "true", "effect": "NoSchedule"}
# The node a JobSet pod runs on, from the downward API (spec.nodeName; trainer/jobs/jobset.py).
NODE_NAME_ENV = "TRAINSTACK_NODE_NAME"
# Karpenter labels every node it makes with its NodePool (Karpenter concepts/scheduling.md, well-known labels); only
# such a node is deleted on quarantine, since Karpenter's finalizer then terminates its instance.
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
