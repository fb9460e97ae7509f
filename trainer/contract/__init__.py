"""The contract between infra/, image/ and the trainer: torch-free facts each side reads and none keeps a copy of.

    catalog        GPU instance types: GPUs, memory, EFA interfaces, peak FLOP/s, bandwidth (launch template, job
                   definition, MFU, planner, preflight)
    image          the image's settings files: NCCL/EFA environment (efa.env), version pins (versions.env)
    container      paths inside the container, the default command and the stop grace (container.env)
    jobset         what a JobSet's submitter and its pods both read: the replicated job, its labels and variables
    compatibility  whether the installed torch, TransformerEngine and megatron-core form the image's pinned set
    metrics        every metric the trainer exports, defined once (exporters, alert rules, the stack's alarms)
    outputs        the names of the stack outputs the job tools read
    retry          the exit code that asks for a retry on fresh hosts
    stack          which cluster a stack describes, from its checked-in Pulumi.<env>.yaml
    teams          what a team is called where (the stack's roles and shares, `make train TEAM=`)
    serving        the inference pool: the LMI image pin, the endpoint's variant, scaling and smoke metric, who owns
                   which of its resources
    controls       the security controls `make compliance` reports on, and what implements each
    gpu_nodes      the taint an EKS stack's GPU nodes carry and the toleration the pods meant for them need

infra/ imports the trainer only through this package, and trainer/ imports nothing from infra/.
"""
