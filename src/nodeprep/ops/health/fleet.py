"""The checks that compare nodes: GPU count per model, ECC and MIG modes, RDMA ports and
rates, the job network's speed and MTU. A node is judged against the rest of the fleet (the
majority, or the best for counts and rates): one slow link or a missing GPU stalls every rank.
Each returns [(node, code, verdict, reason, fix)]."""

from __future__ import annotations

from collections import Counter

from nodeprep.engine.facts.gpuhealth import GPU_DETAIL
from nodeprep.engine.facts.nodehealth import LIMITS, NET_LINKS, RDMA_PORTS
from nodeprep.ops.health.findings import Context, Verdict

OK = Verdict.OK
WARN = Verdict.WARN
UNKNOWN = Verdict.UNKNOWN
CRITICAL = Verdict.CRITICAL


def _majority(values: dict[str, object]):
    counts = Counter(values.values())
    return counts.most_common(1)[0][0] if counts else None


def gpu_count(facts: dict, ctxs: dict[str, Context]) -> list:
    """Nodes of one GPU model should have as many GPUs as the best of them; a node with none
    while others have them is short too (unless nvidia-smi could not answer: that is UNKNOWN
    in its own check)."""
    detail = {n: f[GPU_DETAIL] for n, f in facts.items()}
    model = {n: d["gpus"][0]["name"] for n, d in detail.items() if d["state"] == "ok" and d["gpus"]}
    if not model:
        return []
    best: dict[str, int] = {}
    for n, m in model.items():
        best[m] = max(best.get(m, 0), len(detail[n]["gpus"]))
    out = []
    for n, d in detail.items():
        if n in model and len(d["gpus"]) < best[model[n]]:
            out.append(
                (
                    n,
                    "GPU_COUNT",
                    CRITICAL,
                    f"{len(d['gpus'])} of {best[model[n]]} {model[n]} GPUs "
                    "(other nodes of that model have more)",
                    "reseat or replace the missing GPU; look for Xid 79 in the kernel log; reboot",
                )
            )
        elif n not in model and (
            d["state"] == "absent" and not d.get("devices") or d["state"] == "ok"
        ):
            out.append(
                (
                    n,
                    "GPU_COUNT",
                    CRITICAL,
                    f"no GPUs, while {len(model)} other node(s) have "
                    f"{', '.join(sorted(set(model.values())))}",
                    "load the NVIDIA driver (or --limit the GPU "
                    "nodes if this node is meant to have none)",
                )
            )
    return out


def _mode_mismatch(facts, key, code, verdict, what, fix) -> list:
    modes = {
        n: tuple(g[key] if key != "ecc" else g["ecc"]["mode"] for g in f[GPU_DETAIL]["gpus"])
        for n, f in facts.items()
        if f[GPU_DETAIL]["state"] == "ok" and f[GPU_DETAIL]["gpus"]
    }
    per_node = {n: tuple(sorted(set(m) - {None})) for n, m in modes.items()}
    per_node = {n: m for n, m in per_node.items() if m}
    want = _majority(per_node)
    return [
        (n, code, verdict, f"{what} {'/'.join(m)}, most nodes {'/'.join(want)}", fix)
        for n, m in per_node.items()
        if m != want
    ]


def ecc_mode(facts: dict, ctxs: dict) -> list:
    return _mode_mismatch(
        facts,
        "ecc",
        "ECC_MODE_MISMATCH",
        WARN,
        "ECC",
        "make ECC equal: "
        "`sudo nvidia-smi -e 1` then reset the GPUs (memory size and speed differ with it)",
    )


def mig_mode(facts: dict, ctxs: dict) -> list:
    return _mode_mismatch(
        facts,
        "mig",
        "MIG_MISMATCH",
        CRITICAL,
        "MIG",
        "make MIG equal: `sudo nvidia-smi "
        "-mig 0` (or 1 and the same instances) then reset the GPUs",
    )


def rdma(facts: dict, ctxs: dict) -> list:
    ports = {n: {(p["device"], p["port"]): p for p in f[RDMA_PORTS]} for n, f in facts.items()}
    keys = sorted({k for p in ports.values() for k in p})
    out = []
    for k in keys:
        here = {n: p[k] for n, p in ports.items() if k in p}
        active = {n: p for n, p in here.items() if p["state"] == "ACTIVE"}
        name = f"{k[0]} port {k[1]}"
        for n in ports:
            if n not in here and active:
                out.append(
                    (
                        n,
                        "RDMA_MISSING",
                        CRITICAL,
                        f"no {k[0]} (active on {len(active)} other node(s))",
                        "check the HCA and its driver (ibstat, dmesg | grep mlx)",
                    )
                )
            elif n in here and n not in active and (active or len(ports) == 1):
                out.append(
                    (
                        n,
                        "RDMA_PORT_DOWN",
                        CRITICAL if active else WARN,
                        f"{name} is {here[n]['state']} ({here[n]['phys_state']})"
                        + (f", ACTIVE on {len(active)} other node(s)" if active else ""),
                        "check the cable and the switch port; "
                        "`sudo ibportstate` / the subnet manager",
                    )
                )
        rates = {n: p["rate_gbps"] for n, p in active.items() if p["rate_gbps"]}
        top = max(rates.values(), default=None)
        for n, r in rates.items():
            if r < top:
                out.append(
                    (
                        n,
                        "RDMA_RATE",
                        CRITICAL,
                        f"{name} at {active[n]['rate']}, others at {top:g} Gb/sec",
                        "reseat or replace the cable/transceiver; check the switch port's speed",
                    )
                )
    return out


def net_link(facts: dict, ctxs: dict) -> list:
    """The interface the node's traffic to the first node goes through (what NCCL's socket
    transport and the launchers use): its speed no lower than the best, its MTU the majority's."""
    links = {}
    out = []
    for n, f in facts.items():
        ifname = ctxs[n].interface
        link = f[NET_LINKS].get(ifname) if ifname else None
        if link is None:
            out.append(
                (
                    n,
                    "NET_UNKNOWN",
                    UNKNOWN,
                    f"cannot tell which interface reaches the first node ({ifname or 'no route'})",
                    "check `ip route get <first node's address>` on the node",
                )
            )
        else:
            links[n] = (ifname, link)
    top = max((lk["speed_mbps"] for _i, lk in links.values() if lk["speed_mbps"]), default=None)
    mtu = _majority({n: lk["mtu"] for n, (_i, lk) in links.items()})
    for n, (ifname, lk) in links.items():
        if lk["speed_mbps"] and top and lk["speed_mbps"] < top:
            out.append(
                (
                    n,
                    "NET_SPEED",
                    CRITICAL,
                    f"{ifname} at {lk['speed_mbps']} Mb/s, others up to {top} Mb/s",
                    "check the cable, the switch port and `ethtool` autonegotiation",
                )
            )
        if lk["mtu"] != mtu:
            out.append(
                (
                    n,
                    "NET_MTU",
                    CRITICAL,
                    f"{ifname} MTU {lk['mtu']}, most nodes {mtu}: mixed MTUs stall large transfers",
                    f"sudo ip link set {ifname} mtu {mtu} (and in the network config)",
                )
            )
    return out


def limits_equal(facts: dict, ctxs: dict) -> list:
    """A node whose locked-memory or open-files limit is below most nodes': the limits.d line
    (or the service's LimitMEMLOCK) that the others have is missing there."""
    out = []
    for key, code, what in (
        ("memlock_kib", "MEMLOCK_BELOW_FLEET", "locked memory"),
        ("nofile", "NOFILE_BELOW_FLEET", "open files"),
    ):
        vals = {n: f[LIMITS][key] for n, f in facts.items()}
        want = _majority({n: (float("inf") if v is None else v) for n, v in vals.items()})
        for n, v in vals.items():
            if v is not None and want is not None and v < want:
                shown = "unlimited" if want == float("inf") else f"{want:g}"
                unit = " KiB" if key == "memlock_kib" else ""
                out.append(
                    (
                        n,
                        code,
                        CRITICAL,
                        f"{what} limited to {v}{unit}, most nodes {shown}{unit}",
                        "give this node the limits.d line (and the service's Limit*) "
                        "the others have, then log in again",
                    )
                )
    return out


FACTS = (GPU_DETAIL, RDMA_PORTS, NET_LINKS, LIMITS)
