"""The NCCL / aws-ofi-nccl environment a node needs, computed once on the controller and used
by the `nccl` role (env file sourced by shells), the `deepspeed_env` role (~/.deepspeed_env,
since the DeepSpeed launcher forwards neither LD_LIBRARY_PATH nor FI_*) and later by launchers.
Facts: ../shared/reference/nccl-deepspeed-launchers.md."""
from __future__ import annotations

import re

# Never chosen for NCCL traffic: loopback and virtual bridges/tunnels (NCCL's own `^docker0`
# advice can pick `lo`).
_VIRTUAL = re.compile(r"^(lo|docker\d*|virbr\d*|veth.*|br-.*|cni\d*|flannel.*|cali.*|tun\d*|tap\d*|"
                      r"vxlan.*|kube-.*|weave.*|\?)$")


def propose_socket_ifname(fleet_interfaces: dict[str, dict], addresses: dict[str, str]) -> tuple[str | None, str]:
    """Pick the interface every node has; prefer the one carrying each node's inventory
    address. Returns (value for NCCL_SOCKET_IFNAME or None, a sentence saying why)."""
    if not fleet_interfaces:
        return None, "no interface facts"
    names = [set(n for n, a in ifs.items() if a and not _VIRTUAL.match(n))
             for ifs in fleet_interfaces.values()]
    common = set.intersection(*names) if names else set()
    if not common:
        return None, ("no non-virtual interface is shared by every node; set "
                      "nccl_env.NCCL_SOCKET_IFNAME per group")
    carrying = {n for n in common if all(addresses.get(node) in ifs.get(n, [])
                                         for node, ifs in fleet_interfaces.items())}
    pick = sorted(carrying or common)[0]
    why = "carries every node's inventory address" if carrying else "shared by every node"
    return f"={pick}", f"NCCL_SOCKET_IFNAME='={pick}' (exactly {pick}: {why})"


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
    if proposed_ifname and "NCCL_SOCKET_IFNAME" not in env and v.get("nccl_propose_socket_ifname", True):
        env["NCCL_SOCKET_IFNAME"] = proposed_ifname
    return env


def run_proposal(run) -> str | None:
    """Once per run: the NCCL_SOCKET_IFNAME proposal (cached in run.shared), noted for the user."""
    if "socket_ifname" not in run.shared:
        ifs = {n: f["interfaces"] for n, f in run.facts.items() if "interfaces" in f}
        addrs = {h.name: h.address for h in run.hosts}
        value, why = propose_socket_ifname(ifs, addrs)
        run.shared["socket_ifname"] = value
        if any(not (v.get("nccl_env") or {}).get("NCCL_SOCKET_IFNAME") and
               v.get("nccl_propose_socket_ifname", True) for v in run.vars.values()):
            run.notes.append(f"proposed {why}" if value else f"no NCCL_SOCKET_IFNAME proposal: {why}")
    return run.shared["socket_ifname"]
