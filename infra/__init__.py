"""The Pulumi program for a trainstack environment: one ComponentResource per concern, composed in __main__.py.

    config          the stack configuration: one typed model read from Pulumi.<stack>.yaml, validated first
    keys            the stack's customer-managed KMS key and its policy
    network         the VPC: private and public subnets, NAT, endpoints, encrypted flow logs
    data_lake       the datasets and checkpoints buckets
    buckets         what every bucket has: the stack key, versioning, public access blocked, TLS only
    lustre          FSx for Lustre over the data lake, mounted at /fsx on every GPU node
    registry        the trainer image repository (ECR)
    identity        IAM for the cluster: instance role and profile, job role, execution role
    iam             policy-document helpers and the action lists the components use
    cluster         the GPU cluster on AWS Batch: EFA security group, placement, launch template, queues, jobs
    node_bootstrap  what a GPU node runs at boot (the launch template's user data)
    eks             the GPU cluster on EKS instead (orchestrator: eks): control plane, access, node groups, add-ons
    eks_access      who administers an EKS cluster: the admins' access entries, the deployer checked to be one
    cluster_software  what an EKS stack installs in its cluster: device plugins, JobSet, Kueue, FSx volume, queues
    karpenter       GPU nodes that follow admitted work on EKS: EC2NodeClass, NodePool, NodeOverlay, controller IAM
    karpenter_interruption  Karpenter's interruption queue: SQS, its policy, the EventBridge rules, the controller's grant
    node_quarantine what lets a job's pod taint and delete its own failed node on EKS: ClusterRole, admission policy
    eks_teams       teams on an EKS stack: namespace, Kueue queues in a cohort, RBAC, access entry, pod identity
    data_prep       CPU capacity for data preparation: a Spot compute environment and queue, the data job role
    monitoring      alerting and the run dashboard: SNS, CloudWatch alarms, the dashboard
    serving         the inference pool: the SageMaker endpoint's role, security group and rollback alarms
    budget          the stack's AWS Budgets budget on its cost-allocation tag, notifying the alarm topic
    audit           the audit trail: CloudTrail, its Object-Locked log bucket, the CIS metric filters and alarms
    teams           teams on a shared stack: a role each, one tag-based policy, fair share
    k8s_versions    what an EKS stack runs in its cluster, pinned once: Kubernetes minor, Helm charts, add-ons
    k8s_validate    offline validation of generated Kubernetes objects (built-in schemas, pinned CRDs, strict)
    crds/           pinned upstream CRD schemas of charts only this project installs (Karpenter), as fixtures
    preview         the offline preview: the real program under mocks, printed
    mocks           the Pulumi mocks the offline preview and the tests run the program under

`infra.config` and `trainer.contract.outputs` import neither pulumi nor pulumi_aws, so the trainer's tooling (plan, submit)
can read a stack's config and validate its outputs with only the training requirements installed.
"""
