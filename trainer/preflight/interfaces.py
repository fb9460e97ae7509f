"""Which network interface NCCL bootstraps over, by NCCL_SOCKET_IFNAME's rules (NVIDIA/nccl src/misc/utils.cc
parseStringList/matchIfList, src/misc/socket.cc ncclFindInterfaces): a leading '^' excludes the listed names, a
leading '=' matches names exactly, otherwise each entry is a name prefix; interfaces are tried in the order the
system lists them (getifaddrs) and the first IPv4 one that passes is used.

In awsvpc containers the ecs-eth0 link-local interface (169.254.172.0/22) is listed before eth0 (recorded
`ip address` from an ECS awsvpc task: docker-library/cassandra#223; NVIDIA/nccl#859); bootstrapping over it
advertises an address the other nodes cannot reach.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil


def matches(ifname_setting: str, name: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME=ifname_setting lets NCCL use interface `name` (ports ignored)."""
    setting = ifname_setting
    exclude, setting = setting.startswith("^"), setting.lstrip("^")
    exact, setting = setting.startswith("="), setting.lstrip("=")
    entries = [entry.partition(":")[0] for entry in setting.split(",") if entry.partition(":")[0]]
    hit = any(name == entry if exact else name.startswith(entry) for entry in entries)
    return not hit if exclude else hit


def bootstrap_interface(ifname_setting: str, interfaces: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The (name, IPv4 address) NCCL would bootstrap over, from interfaces in system order."""
    return next(((n, a) for n, a in interfaces if matches(ifname_setting, n)), None)


def system_interfaces() -> list[tuple[str, str]]:
    """This host's (name, IPv4 address) pairs in getifaddrs order."""
    return [
        (name, address.address)
        for name, addresses in psutil.net_if_addrs().items()
        for address in addresses
        if address.family == socket.AF_INET
    ]


def is_link_local(address: str) -> bool:
    return ipaddress.ip_address(address).is_link_local
