"""The Pod Security Standards' controls, evaluated on a pod spec as Pod Security Admission would.

Each rule is a control of the Kubernetes document "Pod Security Standards" (kubernetes.io/docs/concepts/security/
pod-security-standards/, the policy version of the cluster's minor), named as there; `violations(spec, level)`
lists the controls of `level` (and the levels below it) a pod spec breaks. Containers are every container,
init container and ephemeral container, as the document's "Restricted Fields" list them.
"""

from __future__ import annotations

from typing import Any

# Baseline, "Capabilities": the only capabilities a container may add.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
# Baseline, "Sysctls": the safe set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
# Restricted, "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
LEVELS = ("privileged", "baseline", "restricted")


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("containers", "initContainers", "ephemeralContainers") for c in spec.get(key, [])]


def _context(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def baseline(spec: dict[str, Any]) -> list[str]:
    pod = spec.get("securityContext") or {}
    found = []
    if any(spec.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        found.append("Host Namespaces")
    if any(_context(c).get("privileged") for c in containers(spec)):
        found.append("Privileged Containers")
    added = {a for c in containers(spec) for a in (_context(c).get("capabilities") or {}).get("add", [])}
    if added - BASELINE_CAPABILITIES:
        found.append("Capabilities")
    if any("hostPath" in v for v in spec.get("volumes", [])):
        found.append("HostPath Volumes")
    if any(p.get("hostPort") for c in containers(spec) for p in c.get("ports", [])):
        found.append("Host Ports")
    windows = [
        pod.get("windowsOptions") or {},
        *(_context(c).get("windowsOptions") or {} for c in containers(spec)),
    ]
    if any(w.get("hostProcess") for w in windows):
        found.append("HostProcess")
    if any(_context(c).get("procMount", "Default") != "Default" for c in containers(spec)):
        found.append("/proc Mount Type")
    profiles = [pod.get("seccompProfile"), *(_context(c).get("seccompProfile") for c in containers(spec))]
    if any(p and p.get("type") == "Unconfined" for p in profiles):
        found.append("Seccomp")
    if any(s["name"] not in SAFE_SYSCTLS for s in pod.get("sysctls", [])):
        found.append("Sysctls")
    return found


def restricted(spec: dict[str, Any]) -> list[str]:
    pod = spec.get("securityContext") or {}
    found = []
    if any(next(iter(set(v) - {"name"}), None) not in RESTRICTED_VOLUMES for v in spec.get("volumes", [])):
        found.append("Volume Types")
    if any(_context(c).get("allowPrivilegeEscalation") is not False for c in containers(spec)):
        found.append("Privilege Escalation")
    # runAsNonRoot true on the pod (and no container setting false), or on every container.
    non_root = [_context(c).get("runAsNonRoot") for c in containers(spec)]
    if not (all(v is True for v in non_root) or (pod.get("runAsNonRoot") is True and False not in non_root)):
        found.append("Running as Non-root")
    if pod.get("runAsUser") == 0 or any(_context(c).get("runAsUser") == 0 for c in containers(spec)):
        found.append("Running as Non-root user")
    allowed = ("RuntimeDefault", "Localhost")
    own = [(_context(c).get("seccompProfile") or {}).get("type") for c in containers(spec)]
    pod_profile = (pod.get("seccompProfile") or {}).get("type")
    if not all(p in allowed or (p is None and pod_profile in allowed) for p in own):
        found.append("Seccomp (restricted)")
    for c in containers(spec):
        capabilities = _context(c).get("capabilities") or {}
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {
            "NET_BIND_SERVICE"
        }:
            found.append("Capabilities (restricted)")
            break
    return found


def violations(spec: dict[str, Any], level: str) -> list[str]:
    """The controls of `level` the pod spec breaks (a namespace enforcing `level` refuses it if any)."""
    assert level in LEVELS, level
    found = baseline(spec) if level in ("baseline", "restricted") else []
    return found + (restricted(spec) if level == "restricted" else [])
