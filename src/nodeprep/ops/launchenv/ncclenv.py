"""The NCCL / aws-ofi-nccl environment a node needs, computed once on the controller and used
by the `nccl` role (env file sourced by shells), the `deepspeed_env` role (~/.deepspeed_env,
since the DeepSpeed launcher forwards neither LD_LIBRARY_PATH nor FI_*) and later by launchers.
Facts: NCCL environment variables, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html;
DeepSpeed multi-node launching, https://www.deepspeed.ai/getting-started/#multi-node-environment-variables."""

from __future__ import annotations

import re

from nodeprep.engine.facts import INTERFACES, ROUTE, reaching
from nodeprep.ops.provision.roles import UNSET

# Never chosen for NCCL traffic: loopback and virtual bridges/tunnels (NCCL's own `^docker0`
# advice can pick `lo`).
_VIRTUAL = re.compile(
    r"^(lo|docker\d*|virbr\d*|veth.*|br-.*|cni\d*|flannel.*|cali.*|tun\d*|tap\d*|"
    r"vxlan.*|kube-.*|weave.*|\?)$"
)


def propose_socket_ifname(
    fleet_interfaces: dict[str, dict], addresses: dict[str, str]
) -> tuple[str | None, str]:
    """Pick the interface every node has; prefer the one carrying each node's inventory
    address. Returns (value for NCCL_SOCKET_IFNAME or None, a sentence saying why)."""
    if not fleet_interfaces:
        return None, "no interface facts"
    names = [
        set(n for n, a in ifs.items() if a and not _VIRTUAL.match(n))
        for ifs in fleet_interfaces.values()
    ]
    common = set.intersection(*names) if names else set()
    if not common:
        return None, (
            "no non-virtual interface is shared by every node; set "
            "nccl_env.NCCL_SOCKET_IFNAME per group"
        )
    carrying = {
        n
        for n in common
        if all(addresses.get(node) in ifs.get(n, []) for node, ifs in fleet_interfaces.items())
    }
    pick = sorted(carrying or common)[0]
    why = "carries every node's inventory address" if carrying else "shared by every node"
    return f"={pick}", f"NCCL_SOCKET_IFNAME='={pick}' (exactly {pick}: {why})"


def _selects(value: str, ifs: dict[str, list[str]]) -> set[str]:
    """The interfaces (with an address, not lo) an `=a,b` value selects on a node."""
    names = set(value.lstrip("=").split(","))
    return {n for n, a in ifs.items() if a and n != "lo" and n in names}


def propose_per_node(
    picks: dict[str, str | None], ifs: dict[str, dict], addresses: dict[str, str]
) -> tuple[dict[str, str | None], str]:
    """PICKS: the interface each node reaches the head through (None: unknown). One value for
    every node when the names agree (`=eth0`), or when one list of the names selects exactly
    each node's own interface everywhere (`=eno1,eth0`); else each node its own `=name` (the
    env file is per node; a launcher that copies one node's environment to all, DeepSpeed's
    runner, then leaves it to that file). Falls back to the fleet-wide rule without routes."""
    if not picks or any(p is None for p in picks.values()):
        value, why = propose_socket_ifname(ifs, addresses)
        return {n: value for n in ifs}, why
    names = sorted(set(picks.values()))
    if len(names) == 1:
        v = f"={names[0]}"
        return {
            n: v for n in picks
        }, f"NCCL_SOCKET_IFNAME='{v}' (exactly {names[0]}: every node reaches the head through it)"
    v = "=" + ",".join(names)
    if all(_selects(v, ifs[n]) == {p} for n, p in picks.items()):
        return (
            {n: v for n in picks},
            f"NCCL_SOCKET_IFNAME='{v}' (the nodes reach the head through differently named "
            f"interfaces; this list selects exactly the right one on each node)",
        )
    return (
        {n: f"={p}" for n, p in picks.items()},
        "NCCL_SOCKET_IFNAME per node ("
        + ", ".join(f"{n}: ={p}" for n, p in picks.items())
        + "): no one value selects the right interface on every node",
    )


def fleet_wide(values: dict[str, str | None]) -> bool:
    """Do all nodes get the same value (so a launcher may copy one node's to all)?"""
    return len(set(values.values())) <= 1


def lib_dirs(v: dict) -> list[str]:
    dirs = []
    for key in ("aws_ofi_nccl_home", "nccl_home", "libfabric_home"):
        if v.get(key):
            dirs.append(v[key].rstrip("/") + "/lib")
    return dirs


def node_env(v: dict, proposed_ifname: str | None) -> dict[str, str]:
    """Variables (name -> literal value) the node's NCCL setup needs, in a stable order."""
    env: dict[str, str] = {}
    dirs = lib_dirs(v)
    if dirs:
        env["LD_LIBRARY_PATH"] = ":".join(dirs)
    for k, val in (v.get("nccl_env") or {}).items():
        env[k] = str(val)
    if (
        proposed_ifname
        and "NCCL_SOCKET_IFNAME" not in env
        and v.get("nccl_propose_socket_ifname", True)
    ):
        env["NCCL_SOCKET_IFNAME"] = proposed_ifname
    return env


def run_proposal(prov) -> dict[str, str | None]:
    """Once per run: each node's NCCL_SOCKET_IFNAME proposal (cached in prov.shared), noted
    for the user."""
    if prov.shared.socket_ifname is UNSET:
        head = prov.hosts[0].address
        ifs = {n: f[INTERFACES] for n, f in prov.facts.items() if INTERFACES in f}
        picks = {n: reaching(ifs[n], f.get(ROUTE(head))) for n, f in prov.facts.items() if n in ifs}
        addrs = {h.name: h.address for h in prov.hosts}
        values, why = propose_per_node(picks, ifs, addrs)
        prov.shared.socket_ifname = values
        if any(
            not (v.get("nccl_env") or {}).get("NCCL_SOCKET_IFNAME")
            and v.get("nccl_propose_socket_ifname", True)
            for v in prov.vars.values()
        ):
            prov.notes.append(
                f"proposed {why}"
                if any(values.values())
                else f"no NCCL_SOCKET_IFNAME proposal: {why}"
            )
    return prov.shared.socket_ifname
