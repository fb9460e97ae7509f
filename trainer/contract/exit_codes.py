"""Exit codes the Batch job definition's retry strategy maps to actions (infra must match them).

NODE_FAULT: a node is unfit (a GPU, EFA device, the FSx mount, NVML health, its bandwidth); the faulty node has taken
itself out of service, and a retry lands on fresh hosts. 75 is EX_TEMPFAIL, "temporary failure, the user is invited
to retry" (sysexits.h). Batch: evaluateOnExit onExitCode "75" -> RETRY; the main node's exit code is the job's
(AWS Batch User Guide, "Multi-node parallel jobs").
"""

NODE_FAULT = 75
