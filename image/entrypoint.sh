#!/usr/bin/env bash
# Container entrypoint on every node of a Batch job, and for single-node or local runs.
# Exports the NCCL/EFA environment (efa.env) and the container contract (container.env); non-empty values
# already set by the job or the user win (the Dockerfile empties the base image's own defaults). Then it hands over
# to `python -m trainer launch`, which maps the Batch node variables to a torchrun rendezvous, runs the preflight
# and runs torchrun. exec makes the launcher PID 1, so SIGTERM from Batch reaches it, and it passes it to the ranks.
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")

for settings in "${here}/efa.env" "${here}/container.env"; do
    while IFS= read -r line; do
        [[ $line =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]] || continue
        key=${BASH_REMATCH[1]}
        [[ -n ${!key:-} ]] || eval "export ${key}=${BASH_REMATCH[2]}"
    done < "${settings}"
done

# No command: the contract's default (the job definition passes the same one explicitly).
[[ $# -gt 0 ]] || set -- train --config "${TRAINSTACK_DEFAULT_CONFIG}"
exec python -m trainer launch "$@"
