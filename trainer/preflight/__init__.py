"""`python -m trainer preflight`: is every node fit to train? Checks a backend's launcher runs before training.

command     the verb: the phases (node checks, network, shared storage, NCCL's network, quarantine, report)
pod         what a pod spec cannot say: RLIMIT_MEMLOCK unlimited, only EFA devices under /dev/infiniband
checks      each check a pure function of what it inspects (GPUs, EFA devices, interface, storage, bandwidth)
gpu_health  NVML readings: retired pages, remapped rows, ECC errors, clock slowdowns
interfaces  which interface NCCL bootstraps over (NCCL_SOCKET_IFNAME's rules)
nccl_log    NCCL's and aws-ofi-nccl's INFO lines: the network and provider chosen
netplugin   whether NCCL finds the network plugin image/efa.env asks for (also run by the image build)
pairwise    below the bandwidth floor, which node is slow (pairs in rounds)
storage     whether the checkpoint root is the shared Lustre file system; cross-node tokens
quarantine  a node that failed its own checks leaves service (Auto Scaling unhealthy; on EKS tainted, deleted)
"""
