"""Starting processes: torchrun, the rendezvous each backend gives it, and the supervisor that watches it.

torchrun    the rendezvous, torchrun's command line, and `supervise` (SIGTERM to the ranks, the stop grace):
            every backend's
batch       AWS Batch multi-node variables -> a rendezvous
jobset      a JobSet pod's variables on EKS -> a rendezvous (the leader's DNS name, looked up with retries)
node        `python -m trainer launch`: one node's share of a job (rendezvous, preflight, supervised torchrun)
local       training on the machine at hand: `train` outside torchrun starts torchrun here
run_lock    one live run per run directory: the flock a run holds on <run_dir>/run.lock, and who holds it
imds        this EC2 instance's metadata (IMDSv2): its id and region, for the health report and quarantine
quick_exit  ending a process without the interpreter's last full collection (a second each with torch imported)
"""
