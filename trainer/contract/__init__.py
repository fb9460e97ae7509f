"""The contract between infra/, image/ and the trainer: torch-free facts each side reads and none keeps a copy of.

    catalog     GPU instance types: GPUs, memory, EFA interfaces, peak FLOP/s, bandwidth (launch template, job
                definition, MFU, planner, preflight)
    image       the image's settings files: NCCL/EFA environment (efa.env), version pins (versions.env)
    container   paths inside the container and the default command (container.env)
    outputs     the names of the stack outputs the job tools read

infra/ imports the trainer only through this package, and trainer/ imports nothing from infra/.
"""
