"""A world that says where its rendezvous store listens: each rank resolves the job it is in and joins it, and
rank 0 reads, while every rank is still in the world, the addresses this machine's sockets listen on at the
plan's main port, and those its parent (the launcher) listens on (from /proc/net/tcp and /proc/net/tcp6: nothing
connects to the store from outside).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from pathlib import Path

import trainplan as tp

LISTEN = "0A"
"""The state /proc/net/tcp prints for a listening socket (TCP_LISTEN)."""


def listening_addresses(port: int) -> list[str]:
    """The local addresses of this machine's TCP sockets that listen on `port` (IPv4 and IPv6), sorted."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6 on this machine
            continue
        for row in rows:
            fields = row.split()
            address, _, port_hex = fields[1].partition(":")
            if fields[3] == LISTEN and int(port_hex, 16) == port:
                found.add(_address(address))
    return sorted(found)


def launcher_pid() -> int:
    """The process that launched this one: the parent, or, for a worker forked by the launch's forkserver (whose
    command line names multiprocessing's forkserver), the server's parent."""
    parent = os.getppid()
    try:
        command = Path(f"/proc/{parent}/cmdline").read_bytes()
        if b"forkserver" in command:
            return int(Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return parent


def listening_of(pid: int) -> list[str]:
    """The local addresses (address:port) of the TCP sockets process `pid` listens on (its fds' socket inodes, looked
    up in /proc/net/tcp and /proc/net/tcp6), sorted."""
    inodes: set[str] = set()
    try:
        for descriptor in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    except OSError:
        return []
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, _, port_hex = fields[1].partition(":")
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(f"{_address(address)}:{int(port_hex, 16)}")
    return sorted(found)


def _address(text: str) -> str:
    """An address as /proc/net/tcp* prints it: hex, each 32-bit word in the machine's byte order."""
    raw = bytes.fromhex(text)
    if sys.byteorder == "little":
        raw = b"".join(raw[index : index + 4][::-1] for index in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def main() -> dict[str, object]:
    plan = tp.resolve()
    port = plan.cluster.main_port
    assert port is not None, "a started job names its main port"
    with tp.join(plan) as world:
        import torch
        from torch import distributed

        value = torch.tensor([float(world.rank + 1)])
        distributed.all_reduce(value)
        listening = listening_addresses(port) if world.rank == 0 else []
        parent = listening_of(launcher_pid()) if world.rank == 0 else []  # the launcher's stores, where it has any
        distributed.barrier()  # rank 0 has read the table while every rank was still in the world
        return {
            "rank": world.rank,
            "sum": float(value.item()),
            "world_size": world.world_size,
            "num_nodes": plan.num_nodes,
            "cluster": plan.cluster.kind,
            "main_address": plan.cluster.main_address,
            "main_port": port,
            "listening": listening,
            "parent_listening": parent,
            "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        }


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
