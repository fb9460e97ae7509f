"""A cluster node's share of a job: each backend's variables turned into a rendezvous, then preflight and torchrun.

batch       AWS Batch multi-node variables -> a rendezvous
jobset      a JobSet pod's variables on EKS -> a rendezvous (the leader's DNS name, looked up with retries)
node        `python -m trainer launch`: one node's share of a job (rendezvous, preflight, supervised torchrun)
run_lock    one live run per run directory and checkpoint directory: the flock a run holds on each run.lock, and who holds it

torchrun itself, its supervisor and the machine-at-hand start are trainer/distributed/'s (torchrun, local).
"""
