"""What a JobSet's submitter (trainer/jobs/jobset.py) and its pods (trainer/launch/jobset.py) both read: the
Kueue queue label the stack's admission policy requires (infra/eks_teams.py), the replicated job's name, the labels JobSet puts on every pod and the variables the pod reads them from, and node
rank 0's DNS name. The node count and JobSet name variables are the container contract's (container.py)."""

from __future__ import annotations

# Kueue admits a JobSet through this label (kueue v0.19.2 pkg/controller/constants/constants.go QueueLabel).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REPLICATED_JOB = "node"
# Labels and annotations JobSet puts on every pod (jobset v0.12.0 api/jobset/v1alpha2/jobset_types.go JobSetNameKey,
# ReplicatedJobNameKey); JobSet's own in-place-restart example reads JOBSET_NAME from the first by a fieldRef.
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
# Read by the launcher (trainer/launch/jobset.py).
REPLICATED_JOB_ENV = "JOBSET_REPLICATED_JOB"
# The pod's index in its Indexed Job, which Kubernetes sets in every such pod (Kubernetes docs, "Jobs", completion
# mode Indexed: "the environment variable JOB_COMPLETION_INDEX"): a node's rank (trainer/launch/jobset.py), a sweep
# worker's index (trainer/sweep/worker.py).
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"


def leader_host(jobset: str, replicated_job: str = REPLICATED_JOB) -> str:
    """Node rank 0's DNS name: pod 0 of job 0, under the JobSet's headless service (the subdomain = its name)."""
    return f"{jobset}-{replicated_job}-0-0.{jobset}"
