"""Runs on a stack's cluster: submit the trainer as an AWS Batch multi-node job or an EKS JobSet, follow it, push
images and data.

submit   `make train STACK=<env>`: checks, then a Batch multi-node job or a JobSet
render   `make render STACK=<env>`: what submit would send (JobSet YAML, Batch request JSON), no AWS call
request  the object each orchestrator receives: the Batch SubmitJob request, the JobSet with the stack's settings
jobset   the JobSet an EKS stack runs: pods, devices, FSx claim, failure policy
eks      the EKS API server: the `aws eks get-token` token, JobSets, the leader pod's log
job      status, logs and cancel of a stack's training jobs
finetune `make finetune STACK=<env>`: train, then one job of evaluate -> promote -> export, resuming
smoke    a two-node preflight job that proves a new stack
push     the image to the stack's ECR repository
upload   a prepared dataset to the stack's datasets bucket
data     `make data STACK=<env>`: prepare shards as a Batch array job on the CPU queue, merge, publish a version
sweep    `make sweep STACK=<env> PARALLEL=N`: a sweep's workers as one Batch array job (or JobSet) sharing the study
         on FSx
measure  `trainer measure-stack`: the planner's best layouts, each a few steps as a job of the stack; the fastest
audit      `make audit`: who submitted, cancelled and changed what, newest first
k8s_audit  an EKS stack's control plane audit log for `make audit`: writes in the cluster, who made them
residency  the run's buckets in the stack's allowed regions, checked before a submit
teams      `make train TEAM=`: the team's share, tag and quota

A stack's outputs and the AWS clients every verb uses are the ground floor's (trainer/aws/).
"""
