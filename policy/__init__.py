"""trainstack's CrossGuard policy pack: the guardrails every stack must pass (see docs/policy.md).

`pulumi preview|up --policy-pack policy` runs it for real (`policy/__main__.py` serves the pack);
`make policy STACK=<env>` runs the same policies over the offline preview (`policy/offline.py`).

    pack              the pack's name, enforcement level and every policy, in docs/policy.md's order
    encryption        encryption at rest with a customer-managed KMS key; keys that rotate
    s3                buckets: the stack's key, public access blocked, TLS only, versioned
    iam               no statement allows every action or every resource beyond AWS's exceptions
    network           no ingress from the internet, EFA's self-referencing rules, the S3 gateway endpoint
    launch_templates  IMDSv2 only, no public IP on multi-interface (EFA) nodes
    monitoring        alerting that reaches someone, messages under the stack's key
    protection        data-holding resources protected in prod
    audit             the audit trail recorded everywhere, signed, encrypted, locked and watched
    cost              every resource that costs money carries the stack's cost-allocation tags
    residency         nothing lives, replicates or is copied outside `trainstack:allowedRegions`
    compliance        `make compliance`: each control's policies, resources and status
    aws_rules         AWS's own cross-resource rules (Batch, EC2/EFA, FSx for Lustre, KMS), each with its source
    serving           every SageMaker endpoint encrypted, in a VPC, rolled back by alarms; the pool's alarms
    eks               EKS stacks: catalog, node template or node class, Kueue quota and JobSet agree; grace; fixed
                      versions; Capacity Block templates; grants before use; the control plane's audit log
    kueue             Kueue objects against its documented semantics: cohorts, whole-node quotas, waitForPodsReady
    rbac              Kubernetes RBAC decided as the API server does; each team only in its own namespace
    aws_types         the pulumi-aws type tokens the policies judge
    resources         reading resources as the analyzer hands them over
    offline           `make policy`: the policies over a stack's offline preview, then the access check
    access            `make access`: every actor's needs and must-nots, decided from the planned policies
    actors            the stack's actors and what each must and must not do, read from the planned policies
    iam_evaluation    IAM's and KMS's evaluation logic, offline: identity, resource and key policies, conditions
    cloudsplaining_check  cloudsplaining over every policy document, against cloudsplaining-baseline.yaml
    checkov_k8s       `make policy` on EKS: checkov over the stack's Kubernetes objects and JobSets, a reviewed baseline
"""
